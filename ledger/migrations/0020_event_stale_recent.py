# The dashboard's stale-token rejections per hour (ledger/trends.py) read the refusals of
# the last 24 hours from this small partial index (occurred_at, with the run id to find
# the tenant) instead of every refusal of every run ever (event_stale_refusals leads with
# the run). On PostgreSQL it is built CONCURRENTLY: appends to the events table go on while
# it is built; the embedded SQLite builds it plainly (and without the INCLUDE).

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models import Q

INDEX = models.Index(
    fields=["occurred_at"], include=["run"], condition=Q(type="STALE_TOKEN_REJECTED"), name="event_stale_recent"
)


class AddIndexWhereConcurrent(AddIndexConcurrently):
    """CONCURRENTLY where the database has it, a plain CREATE INDEX elsewhere."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("ledger", "0019_cost_escrow"),
    ]

    operations = [AddIndexWhereConcurrent("event", INDEX)]
