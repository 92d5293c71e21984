# Issue 16: a run's head update becomes HOT. Two partial indexes of ledger_run read the phase
# counters in their condition (run_uncertain_recent: n_dispatched; run_in_flight: n_authorized
# and n_dispatched), so authorize, dispatch and an outcome each wrote an entry into every index
# of the run (fifteen), three updates of four. They now select on may_be_in_flight, which
# changes once, when the run ends (0029 swaps the indexes).
#
# The column arrives False on the rows already there (a default stored once, no rewrite), the
# runs that are unfinished or have something in flight are set True (a scan, writing only
# those), and then the default becomes True for new rows, whoever writes them. All of it in
# one transaction: the table is locked from the first step, so no row is written in between.

from django.db import migrations, models

FINISHED = ["CANCELLED", "COMPLETED", "TIMED_OUT"]


def flag_runs_in_flight(apps, schema_editor):
    Run = apps.get_model("ledger", "Run")
    in_flight = models.Q(n_pending_approval__gt=0) | models.Q(n_authorized__gt=0) | models.Q(n_dispatched__gt=0)
    Run.objects.filter(~models.Q(status__in=FINISHED) | in_flight).update(may_be_in_flight=True)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0027_run_totals"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="may_be_in_flight",
            field=models.BooleanField(db_default=False, default=True),
        ),
        migrations.RunPython(flag_runs_in_flight, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="run",
            name="may_be_in_flight",
            field=models.BooleanField(db_default=True, default=True),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(may_be_in_flight=True)
                | models.Q(status__in=FINISHED, n_pending_approval=0, n_authorized=0, n_dispatched=0),
                name="run_in_flight_flagged",
            ),
        ),
    ]
