# The data planes (docs/architecture.md, Data planes): the diagnostic plane's payloads, kept beside the chain
# that commits to their digests; each tenant's retention per class and user-content opt-in;
# the markers of what retention removed from checkpoint states and boot evidence. The
# events' index for the verifier's pass over payloads is 0033 (built concurrently).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0031_operation_fencing_token'),
    ]

    operations = [
        migrations.CreateModel(
            name='DiagnosticPayload',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('schema_version', models.PositiveSmallIntegerField(default=1)),
                ('seq', models.BigIntegerField()),
                ('klass', models.CharField(max_length=32)),
                ('digest', models.CharField(max_length=71)),
                ('body', models.JSONField(blank=True, null=True)),
                ('size', models.PositiveIntegerField()),
                ('created_at', models.DateTimeField()),
                ('removed_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.AddField(
            model_name='progresscheckpoint',
            name='state_removed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='tenant',
            name='retention_days',
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        migrations.AddField(
            model_name='tenant',
            name='user_content_opt_in',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='workerboot',
            name='evidence_removed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='diagnosticpayload',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.run'),
        ),
        migrations.AddField(
            model_name='diagnosticpayload',
            name='tenant',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.tenant'),
        ),
        migrations.AddIndex(
            model_name='diagnosticpayload',
            index=models.Index(condition=models.Q(('removed_at__isnull', True)), fields=['tenant', 'klass', 'created_at'], name='diagnostic_payload_kept'),
        ),
        migrations.AddConstraint(
            model_name='diagnosticpayload',
            constraint=models.UniqueConstraint(fields=('run', 'seq'), name='diagnostic_payload_unique_seq_per_run'),
        ),
        migrations.AddConstraint(
            model_name='diagnosticpayload',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('body__isnull', True), ('removed_at__isnull', False)), models.Q(('body__isnull', False), ('removed_at__isnull', True)), _connector='OR'), name='diagnostic_payload_body_xor_removed'),
        ),
    ]
