# The dashboard's stale-token rejections per hour (ledger/trends.py) read the refusals of
# the last 24 hours from this small partial index (occurred_at, with the run id to find
# the tenant) instead of every refusal of every run ever (event_stale_refusals leads with
# the run). It is built CONCURRENTLY: appends to the events table go on while it is built.

from django.db import migrations, models
from django.db.models import Q

from django.contrib.postgres.operations import AddIndexConcurrently

INDEX = models.Index(
    fields=["occurred_at"], include=["run"], condition=Q(type="STALE_TOKEN_REJECTED"), name="event_stale_recent"
)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("ledger", "0019_cost_escrow"),
    ]

    operations = [AddIndexConcurrently("event", INDEX)]
