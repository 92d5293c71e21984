"""Upgrades without guessing (the schema-migration article): where each change of a
record's shape stands, the backfills that move records to the new version (resumable, one
at a time), the records whose two representations disagree (StateConflict: automation on
that run stops until a person decides), and what each backup contains."""

from django.db import models
from django.db.models import Q

from ledger.models.runs import Run
from ledger.models.tenancy import Tenant
from ledger.states import BackfillState, ConflictStatus, UpgradePhase
from ledger.versioning import Versioned


class SchemaChange(Versioned):
    """One change of a record's shape, e.g. ``operation.provider_ref``: its phase, and who
    moved it there and why. Changed only by ``ledger.services.upgrades.changes``."""

    name = models.CharField(primary_key=True, max_length=100)
    phase = models.CharField(max_length=16, choices=UpgradePhase.choices, default=UpgradePhase.EXPAND)
    from_version = models.PositiveSmallIntegerField()
    to_version = models.PositiveSmallIntegerField()
    changed_at = models.DateTimeField()
    changed_by = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(phase__in=UpgradePhase.values), name="change_phase_valid")]


class Backfill(Versioned):
    """A backfill's progress and its lock, in one row: the last key done (it resumes after
    it), the counts, and who runs it until when (a crashed runner's lock lapses)."""

    name = models.CharField(primary_key=True, max_length=100)
    state = models.CharField(max_length=16, choices=BackfillState.choices, default=BackfillState.PAUSED)
    last_key = models.CharField(max_length=100, blank=True, default="")  # "" = from the start
    scanned = models.PositiveBigIntegerField(default=0)
    changed = models.PositiveBigIntegerField(default=0)
    conflicts = models.PositiveBigIntegerField(default=0)
    total_estimate = models.PositiveBigIntegerField(default=0)
    batches = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    holder = models.CharField(max_length=200, blank=True, default="")  # host:pid of the runner
    held_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(state__in=BackfillState.values), name="backfill_state_valid")]


class StateConflict(Versioned):
    """A record whose two representations disagree during an upgrade window. Its run's
    fenced calls are refused (409 STATE_CONFLICT) while it is open; only a person closes
    it, choosing which representation is right, with a reason. Never closed by a default."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="state_conflicts")
    change = models.CharField(max_length=100)  # the SchemaChange name
    record = models.CharField(max_length=100)  # e.g. "operation:<uuid>"
    old_value = models.JSONField()  # the old representation, as read (never a secret: ids only)
    new_value = models.JSONField()
    found_by = models.CharField(max_length=100)  # which reader or backfill saw it
    found_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=ConflictStatus.choices, default=ConflictStatus.OPEN)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolution = models.CharField(max_length=8, blank=True, default="")  # "old" or "new"
    reason = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ConflictStatus.values), name="conflict_status_valid"),
            # One open conflict per record: a second reader that sees it finds it open.
            models.UniqueConstraint(
                fields=["change", "record"], condition=Q(status=ConflictStatus.OPEN), name="conflict_open_per_record"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "found_at"], condition=Q(status=ConflictStatus.OPEN), name="conflict_open")
        ]


class BackupManifest(Versioned):
    """What a backup holds, written into the database just before it is dumped (so the
    manifest travels inside the backup): the migrations applied, the schema versions of the
    records and the phase of every change. ``restore_check`` compares a restored database
    with its newest manifest."""

    taken_at = models.DateTimeField()
    taken_by = models.CharField(max_length=150)
    label = models.CharField(max_length=200, blank=True, default="")
    manifest = models.JSONField()

    class Meta:
        ordering = ["-taken_at"]
