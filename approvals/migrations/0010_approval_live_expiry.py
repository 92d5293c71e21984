# Issue 16: the approval expiry job reads the live requests due in (expires_at, id) order, a
# batch at a time. Through approval_expiring_all each batch stepped over every request
# already expired, used or decided before it (a sweep of a backlog grew with its square);
# through this partial index it walks the live ones only. Built without blocking writes.

from django.db import migrations, models

from django.contrib.postgres.operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # the index is built CONCURRENTLY on PostgreSQL

    dependencies = [
        ("approvals", "0009_console_lists"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="approvalrequest",
            index=models.Index(
                condition=models.Q(("status__in", ["PENDING", "APPROVED"])),
                fields=["expires_at", "id"],
                name="approval_live_expiry",
            ),
        ),
    ]
