# Issue 40: the runs list's "stuck" filter walks the ACTIVE runs newest first instead of every
# run, and the stuck-run counts (dashboard, /metrics) one tenant's ACTIVE runs; the run page
# finds a run's MCP session events without reading its whole chain. The condition reads the status only (not
# last_progress_at, which every transition writes), so the run head's updates stay HOT. Built
# without blocking writes.

from django.db import migrations, models

from django.contrib.postgres.operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # the index is built CONCURRENTLY on PostgreSQL

    dependencies = [
        ("ledger", "0043_activity_feed_saved_views"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                fields=["-created_at", "-id"], condition=models.Q(status="ACTIVE"), name="run_active_recent"
            ),
        ),
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                fields=["tenant", "-created_at"], condition=models.Q(status="ACTIVE"), name="run_active_tenant"
            ),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(
                fields=["run", "seq"],
                condition=models.Q(type__in=["x.mcp.session", "x.mcp.redacted"]),
                name="event_mcp",
            ),
        ),
    ]
