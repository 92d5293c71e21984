"""Case groups and case timers (issue 40): the tool, provider and last reconciler verdict that
group similar cases, copied onto each case (existing ones filled from their operation and
lookup history); when a case was escalated; the indexes of the group query and the claim timer."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0010_approval_live_expiry'),
        ('ledger', '0039_flow_control'),
    ]

    operations = [
        migrations.AddField(
            model_name='reconciliationcase',
            name='escalated_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='reconciliationcase',
            name='provider',
            field=models.CharField(blank=True, db_default='', default='', max_length=100),
        ),
        migrations.AddField(
            model_name='reconciliationcase',
            name='tool',
            field=models.CharField(blank=True, db_default='', default='', max_length=100),
        ),
        migrations.AddField(
            model_name='reconciliationcase',
            name='verdict',
            field=models.CharField(blank=True, db_default='', default='', max_length=16),
        ),
        migrations.RunSQL(
            """
            UPDATE approvals_reconciliationcase c
               SET tool = o.tool,
                   provider = COALESCE(o.provider, ''),
                   verdict = LEFT(COALESCE(c.lookup_history -> -1 ->> 'verdict', ''), 16)
              FROM ledger_operation o
             WHERE o.id = c.operation_id
            """,
            migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name='reconciliationcase',
            index=models.Index(condition=models.Q(('status__in', ('OPEN', 'CLAIMED', 'ESCALATED'))), fields=['tenant', 'tool', 'provider', 'reason', 'verdict', 'opened_at'], name='case_group'),
        ),
        migrations.AddIndex(
            model_name='reconciliationcase',
            index=models.Index(condition=models.Q(('status', 'CLAIMED')), fields=['claimed_at'], name='case_claim_timer'),
        ),
    ]
