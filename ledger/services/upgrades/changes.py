"""Where each schema change stands, and the only way it moves.

A change goes EXPAND -> MIGRATE -> CONTRACT, one release each (the article's three):

- EXPAND: the new column exists and every writer fills it beside the old one; records stay
  at the old version, so a build that knows only that version reads everything as before.
- MIGRATE: writers write the new version (the old representation still beside it); the
  backfill moves the old records; every reader compares the two (a disagreement is a
  StateConflict, never a guess). Refused while a live worker's build cannot read the new
  version (it would refuse the records: safe, but it stops working).
- CONTRACT: writers write and readers read only the new representation. Refused until no
  record is left at the old version, no conflict of the change is open, the backfill is
  DONE and no registered worker's build is behind.

MIGRATE may go back to EXPAND (a rolled-back release: records already at the new version stay
readable by this build, and the old build refuses them safely); CONTRACT is not undone.

Each process keeps a change's phase for ``UPGRADE_PHASE_CACHE_S`` seconds. A process that
still writes the old way just after a move leaves at most a few records at the old version:
CONTRACT counts them, and running the backfill again moves them."""

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.errors import InvalidInput, NotFound, UpgradeRefused
from ledger.models import Backfill, SchemaChange, StateConflict
from ledger.services.core.decisions import decision_reason
from ledger.services.upgrades.fleet import behind
from ledger.services.upgrades.phases import phase_forget
from ledger.services.upgrades.registry import spec_for
from ledger.states import BackfillState, ConflictStatus, UpgradePhase

log = logging.getLogger("fenceline.upgrades")

_ORDER = [UpgradePhase.EXPAND, UpgradePhase.MIGRATE, UpgradePhase.CONTRACT]


# The changes this build knows: (from version, to version). Migration ledger.0022 records
# operation.provider_ref in EXPAND; a database emptied since (a test's flush) gets it back here.
KNOWN_CHANGES = {"operation.provider_ref": (1, 2)}


def _first(name: str) -> dict[str, Any]:
    """What a change's row holds before its first move: EXPAND, by the release that added it."""
    if name not in KNOWN_CHANGES:
        raise NotFound(f"there is no schema change {name!r}; known: {', '.join(sorted(KNOWN_CHANGES))}")
    versions = KNOWN_CHANGES[name]
    return {
        "phase": UpgradePhase.EXPAND,
        "from_version": versions[0],
        "to_version": versions[1],
        "changed_at": timezone.now(),
        "changed_by": "system:upgrade",
        "reason": "expand: the change's first phase",
    }


def change_read(name: str) -> SchemaChange:
    """Change ``name`` as stored, or (its row missing) as it stands before its first move;
    writes nothing, for the readers (the console, the preconditions)."""
    defaults = _first(name)
    return SchemaChange.objects.filter(name=name).first() or SchemaChange(name=name, **defaults)


def change_get(name: str) -> SchemaChange:
    """Change ``name``'s row, created in its first phase when missing (only a move writes it)."""
    change, _ = SchemaChange.objects.get_or_create(name=name, defaults=_first(name))
    return change


def records_behind(name: str) -> int:
    """Records of change ``name`` still at the old version."""
    spec = spec_for(name)
    change = change_read(name)
    return spec.model.objects.filter(schema_version__lt=change.to_version).count()


def change_preconditions(name: str, to: str) -> list[str]:
    """What stands in the way of moving change ``name`` to phase ``to`` (empty: nothing)."""
    change = change_read(name)
    if to not in UpgradePhase.values:
        raise InvalidInput(f"phase must be one of {', '.join(UpgradePhase.values)}", field="phase")
    here, there = _ORDER.index(UpgradePhase(change.phase)), _ORDER.index(UpgradePhase(to))
    if here == there:
        return [f"{name} is already in {to}"]
    if there < here and change.phase == UpgradePhase.CONTRACT:
        return [f"{name} is contracted: the old representation is no longer written, so there is no way back"]
    if there > here + 1:
        return [f"{name} moves one phase at a time: {change.phase} -> {_ORDER[here + 1]} first"]
    problems = []
    if there > here:
        old = behind(change.to_version, live_only=to == UpgradePhase.MIGRATE)
        if old:
            who = "live worker" if to == UpgradePhase.MIGRATE else "registered worker"
            problems.append(
                f"{len(old)} {who}{'s' if len(old) != 1 else ''} cannot read schema_version {change.to_version}: "
                + ", ".join(b.describe() for b in old[:10])
            )
    if to == UpgradePhase.CONTRACT:
        left = records_behind(name)
        if left:
            problems.append(f"{left} record{'s' if left != 1 else ''} still at schema_version {change.from_version}")
        conflicts = StateConflict.objects.filter(change=name, status=ConflictStatus.OPEN).count()
        if conflicts:
            problems.append(f"{conflicts} open state conflict{'s' if conflicts != 1 else ''} of {name}")
        backfill = Backfill.objects.filter(name=name).first()
        if backfill is None or backfill.state != BackfillState.DONE:
            state = "never run" if backfill is None else backfill.state
            problems.append(f"the backfill of {name} is not DONE ({state})")
    return problems


def change_move(*, name: str, to: str, by: str, reason: object) -> SchemaChange:
    """Move change ``name`` to phase ``to`` (one step), or UpgradeRefused naming every
    precondition that does not hold. ``by`` names the person or command."""
    why = decision_reason(reason)
    with transaction.atomic():
        change_get(name)  # the row exists from here on
        change = SchemaChange.objects.select_for_update().get(name=name)  # one move at a time
        problems = change_preconditions(name, to)
        if problems:
            raise UpgradeRefused(f"{name} cannot move to {to}: " + "; ".join(problems), problems=problems)
        was = change.phase
        SchemaChange.objects.filter(name=name).update(
            phase=to, changed_at=timezone.now(), changed_by=by[:150], reason=why
        )
    phase_forget()
    log.warning("schema change %s moved %s -> %s by %s: %s", name, was, to, by, why)
    return change_get(name)
