# The fencing token an operation was dispatched under is its `fencing_token`, the one name
# the code, the columns and the API give a fencing token (it was `dispatch_token`). A rename:
# the column keeps its data. PostgreSQL's check constraint follows the renamed column by
# itself, so only Django's picture of the constraint is written again (no table scan).

from django.db import migrations, models

from ledger.states import Phase

DISPATCHED_HAS_TOKEN = models.CheckConstraint(
    condition=models.Q(phase__in=[Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED, Phase.DENIED])
    | models.Q(fencing_token__isnull=False, dispatched_at__isnull=False),
    name="operation_dispatched_has_token",
)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0030_redundant_indexes")]

    operations = [
        migrations.RenameField(model_name="operation", old_name="dispatch_token", new_name="fencing_token"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="operation", name="operation_dispatched_has_token"),
                migrations.AddConstraint(model_name="operation", constraint=DISPATCHED_HAS_TOKEN),
            ]
        ),
    ]
