"""The case_escalated notification kind (issue 40): a choice of WebhookDelivery.kind, no SQL."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0040_roles_runbooks_routes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='webhookdelivery',
            name='kind',
            field=models.CharField(choices=[('unknown_aged', "UNKNOWN older than the endpoint's threshold"), ('approval_pending', 'an approval is pending'), ('cleanup_alert', 'a cleanup alert is raised'), ('quarantine', 'a worker is quarantined'), ('chain_broken', "a run's chain is BROKEN"), ('breaker_change', 'the cost breaker changed'), ('case_escalated', 'a reconciliation case is escalated')], max_length=32),
        ),
    ]
