"""The evidence chain: events, appended and never changed, and the verifier's checkpoints."""

import uuid

from django.db import models
from django.db.models import Q

from ledger.models.runs import Run
from ledger.versioning import Versioned


class Event(Versioned):
    """One entry of a run's hash chain. Appended, never updated or deleted."""

    # No index of its own: event_unique_seq_per_run leads with the run.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="events", db_index=False)
    seq = models.BigIntegerField()
    event_id = models.UUIDField(unique=True, default=uuid.uuid4, editable=False)
    type = models.CharField(max_length=64)
    actor = models.CharField(max_length=300)
    occurred_at = models.DateTimeField()
    fields = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=71)
    hash = models.CharField(max_length=71)
    # Beside the chain, not in it: "hmac-sha256:" + hex HMAC of {run_id, seq, hash, key_id}
    # under the event key ``mac_key_id`` (fenceline_client/evidence_verifier.py). Empty on events
    # written before MACs existed (and on raw INSERTs that name no MAC).
    mac_key_id = models.CharField(max_length=64, default="", db_default="", blank=True)
    mac = models.CharField(max_length=100, default="", db_default="", blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_unique_seq_per_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="event_seq_positive"),
        ]
        ordering = ["run", "seq"]
        # A run page's stale-write refusals without reading the rest of a long chain; the
        # dashboard's refusals per hour (ledger/trends.py) without reading every run's.
        indexes = [
            models.Index(fields=["run", "seq"], condition=Q(type="STALE_TOKEN_REJECTED"), name="event_stale_refusals"),
            models.Index(
                fields=["occurred_at"],
                include=["run"],
                condition=Q(type="STALE_TOKEN_REJECTED"),
                name="event_stale_recent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class Checkpoint(Versioned):
    """A signed statement by the verifier: the chain of ``run`` up to ``seq`` ends in
    ``last_hash``. Written only by the verifier; never reachable from the worker API."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="checkpoints")
    seq = models.BigIntegerField()
    last_hash = models.CharField(max_length=71)
    verifier_version = models.CharField(max_length=16)
    key_id = models.CharField(max_length=64)
    mac = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="checkpoint_unique_seq_per_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="checkpoint_seq_positive"),
        ]
        ordering = ["run", "seq"]
