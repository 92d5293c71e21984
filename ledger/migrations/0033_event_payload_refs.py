# The verifier's pass over the payloads a chain commits to by digest (schema version 2 events)
# reads them from this small partial index instead of every event of the run. It is built
# CONCURRENTLY: appends to the events table go on while it is built.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models import Q

INDEX = models.Index(fields=["run", "seq"], condition=Q(schema_version=2), name="event_payload_refs")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("ledger", "0032_data_planes"),
    ]

    operations = [AddIndexConcurrently("event", INDEX)]
