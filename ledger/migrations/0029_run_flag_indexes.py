# Issue 16: the indexes of runs with work in flight select on may_be_in_flight (0028) instead of
# the phase counters, so that a transition's update of its run is HOT. The new ones are built
# first, without blocking writes; then the ones they replace go.

from django.db import migrations, models

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # the indexes are built and dropped CONCURRENTLY on PostgreSQL

    dependencies = [
        ("ledger", "0028_run_may_be_in_flight"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                fields=["-created_at", "-id"],
                condition=models.Q(may_be_in_flight=True) | models.Q(n_unknown__gt=0),
                name="run_uncertain",
            ),
        ),
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(fields=["tenant"], condition=models.Q(may_be_in_flight=True), name="run_may_be_in_flight"),
        ),
        RemoveIndexConcurrently(model_name="run", name="run_uncertain_recent"),
        RemoveIndexConcurrently(model_name="run", name="run_in_flight"),
    ]
