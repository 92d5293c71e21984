# Issue 16: the reservation expiry job reads the RESERVED reservations due in (expires_at, id)
# order, a batch at a time. With (state, expires_at) alone each batch sorted every due
# reservation (a sweep of a backlog grew with its square); with the id in the index each
# batch is a walk from the index's front. The new index is built first, without blocking
# writes; then the one it replaces goes.

from django.db import migrations, models

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # the indexes are built and dropped CONCURRENTLY on PostgreSQL

    dependencies = [
        ("ledger", "0024_unindexed_authority_links"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="costreservation",
            index=models.Index(fields=["state", "expires_at", "id"], name="reservation_state_expiry"),
        ),
        RemoveIndexConcurrently(model_name="costreservation", name="reservation_open"),
    ]
