# Issue 16: an operation's phase change becomes a HOT update. No index of ledger_operation
# names the phase any more (an index on a column, or a partial index whose condition reads
# it, makes every update of that column write a new entry into every index of the table),
# and the table leaves 20 % of each new page free for the updated row versions. A tenant's
# active operations are counted through its runs instead (run_in_flight), and a run's
# operations found through operation_run, in the run page's order.

from django.db import migrations, models

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently

from ledger.migration_operations import set_fillfactor


class Migration(migrations.Migration):
    atomic = False  # the indexes are built and dropped CONCURRENTLY on PostgreSQL

    dependencies = [
        ("ledger", "0022_upgrades_expand"),
    ]

    operations = [
        # New indexes first, built without blocking writes; then the ones they replace go.
        AddIndexConcurrently(
            model_name="operation",
            index=models.Index(fields=["run", "created_at"], name="operation_run"),
        ),
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                fields=["tenant"],
                condition=models.Q(n_pending_approval__gt=0)
                | models.Q(n_authorized__gt=0)
                | models.Q(n_dispatched__gt=0),
                name="run_in_flight",
            ),
        ),
        RemoveIndexConcurrently(model_name="operation", name="operation_run_phase"),
        RemoveIndexConcurrently(model_name="operation", name="operation_tenant_phase"),
        set_fillfactor("ledger_operation", 80),
    ]
