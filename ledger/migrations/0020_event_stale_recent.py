# The dashboard's stale-token rejections per hour (ledger/trends.py) read the refusals of
# the last 24 hours from this small partial index (occurred_at, with the run id to find
# the tenant) instead of every refusal of every run ever (event_stale_refusals leads with
# the run). Built CONCURRENTLY: appends to the events table go on while it is built.
#
# Database only: Event.Meta does not declare it yet (ledger/models/evidence.py belongs to
# another change); declaring it there later needs a SeparateDatabaseAndState migration whose
# state operation is AddIndex(Index(fields=["occurred_at"], include=["run"],
# condition=Q(type="STALE_TOKEN_REJECTED"), name="event_stale_recent")) and no database one.

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("ledger", "0019_cost_escrow"),
    ]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS event_stale_recent ON ledger_event (occurred_at) "
                "INCLUDE (run_id) WHERE type = 'STALE_TOKEN_REJECTED'"
            ),
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS event_stale_recent",
        ),
    ]
