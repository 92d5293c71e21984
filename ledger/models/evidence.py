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
            # Denials by reason over a recent window (the tenant page's and /metrics' report,
            # ledger/observability/cost_report.py): events are never updated, so this costs
            # a denial one entry and every other event none.
            models.Index(
                fields=["occurred_at"],
                include=["run"],
                condition=Q(type="OPERATION_DENIED"),
                name="event_denied_recent",
            ),
            # The verifier's pass over the payloads a chain commits to by digest.
            models.Index(fields=["run", "seq"], condition=Q(schema_version=2), name="event_payload_refs"),
            # The activity feed (ledger/activity.py): every tenant's events newest first, those
            # of one type newest first, and the few written by people and jobs (not workers)
            # by actor, newest first.
            models.Index(fields=["occurred_at", "id"], name="event_recent"),
            models.Index(fields=["type", "occurred_at", "id"], name="event_type_recent"),
            models.Index(
                fields=["actor", "occurred_at", "id"],
                condition=~Q(actor__startswith="worker:"),
                name="event_not_by_workers",
            ),
            # A run page's MCP session (the gateway's x.mcp.session and x.mcp.redacted events,
            # ledger.selectors.run_mcp_session) without reading the rest of a long chain: 58 ms
            # for a run of 100,000 events at 1M runs, 0.02 ms with it.
            models.Index(
                fields=["run", "seq"], condition=Q(type__in=["x.mcp.session", "x.mcp.redacted"]), name="event_mcp"
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


class DiagnosticPayload(Versioned):
    """The diagnostic plane (docs/architecture.md "Data planes"): what an event carries beyond
    its control fields, kept beside the chain. The event's fields hold only
    ``{"payload": {"digest", "class"}}`` (event schema version 2), the digest being
    ``"sha256:" + hex SHA-256`` of the canonical JSON of ``body``, so that retention
    (``manage.py retention``) can remove ``body`` past the tenant's retention for its class
    and every chain still verifies. A removed payload keeps its row: ``body`` is NULL and
    ``removed_at`` says when retention removed it; a payload whose row is gone, or whose
    body no longer hashes to its digest, is a finding of the verifier."""

    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="+", db_index=False)
    seq = models.BigIntegerField()  # the seq of the event that commits to it
    klass = models.CharField(max_length=32)  # ledger.services.evidence.planes.PAYLOAD_CLASSES
    digest = models.CharField(max_length=71)
    body = models.JSONField(null=True, blank=True)
    size = models.PositiveIntegerField()  # bytes of the canonical JSON of body
    created_at = models.DateTimeField()
    removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="diagnostic_payload_unique_seq_per_run"),
            models.CheckConstraint(
                condition=Q(body__isnull=True, removed_at__isnull=False)
                | Q(body__isnull=False, removed_at__isnull=True),
                name="diagnostic_payload_body_xor_removed",
            ),
        ]
        # What retention reads: the kept payloads of one tenant and class, oldest first.
        indexes = [
            models.Index(
                fields=["tenant", "klass", "created_at"],
                condition=Q(removed_at__isnull=True),
                name="diagnostic_payload_kept",
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.klass}"
