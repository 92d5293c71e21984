"""The hot path's schema (issue 16): a run counts the capability budgets, resources and
approval requests it asked for (while a count is 0 the fenced path reads nothing of that
kind; counted here for the runs that have some), and the event and operation tables lose
the single-column foreign-key indexes that their composite indexes already serve (every
event insert and every operation phase change paid an insert into each)."""

import django.db.models.deletion
from django.db import migrations, models

COUNTED = {
    "n_capabilities": "ledger_capabilitybudget",
    "n_resources": "ledger_runresource",
    "n_approvals": "approvals_approvalrequest",
}
# Only the runs that have rows of the kind are touched.
COUNT = """
    UPDATE ledger_run r SET {column} = c.n
    FROM (SELECT run_id, count(*) AS n FROM {table} GROUP BY run_id) c
    WHERE c.run_id = r.id
"""


def count_what_runs_asked_for(apps, schema_editor):
    for column, table in COUNTED.items():
        schema_editor.execute(COUNT.format(column=column, table=table))


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0017_notifications"),
        ("approvals", "0007_case_lookups"),  # its approval requests are counted
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="n_capabilities",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="run",
            name="n_resources",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="run",
            name="n_approvals",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(count_what_runs_asked_for, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="event",
            name="run",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="events", to="ledger.run"
            ),
        ),
        migrations.AlterField(
            model_name="operation",
            name="run",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="operations", to="ledger.run"
            ),
        ),
        migrations.AlterField(
            model_name="operation",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="operations",
                to="ledger.tenant",
            ),
        ),
    ]
