"""The operation.provider_ref change: an operation's record at the provider, from a bare
string (``provider_request_id``, schema_version 1) to a structured reference
``{"provider": ..., "id": ...}`` (``provider_ref``, schema_version 2) that names the
provider the id belongs to, so a reconciler never looks an id up at the wrong provider.

- ``written``: what a writer stores, by phase (both representations until CONTRACT).
- ``reference``: the dual read. When both representations are present they must agree
  (the id is the same; the provider, when the operation names one, is the same); when they
  do not, the record is a StateConflict (``conflicts.conflict_open``): nothing picks one.
- ``ProviderRefBackfill``: moves version-1 operations to version 2, set-based, a batch per
  transaction; it never touches an operation's phase, so an UNKNOWN stays UNKNOWN.
"""

import json
import uuid
from dataclasses import dataclass
from typing import Any

from ledger.errors import InvalidInput
from ledger.models import Operation
from ledger.services.upgrades.phases import phase
from ledger.sql import upgrades as sql_upgrades
from ledger.states import UpgradePhase

CHANGE = "operation.provider_ref"
OLD, NEW = 1, 2


@dataclass(frozen=True)
class ProviderRef:
    provider: str
    id: str

    def as_json(self) -> dict[str, str]:
        return {"provider": self.provider, "id": self.id}


def legacy(provider: str, provider_request_id: str) -> ProviderRef | None:
    """The old representation read the new way: the id, at the operation's provider."""
    return ProviderRef(provider=provider or "", id=provider_request_id) if provider_request_id else None


def parsed(value: object) -> ProviderRef | None:
    """A stored ``provider_ref``; InvalidInput for one that is not {"provider": str, "id": str}."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or set(value) - {"provider", "id"}
        or not isinstance(value.get("id"), str)
        or not value["id"]
        or not isinstance(value.get("provider", ""), str)
    ):
        raise InvalidInput('provider_ref must be {"provider": "...", "id": "..."}', field="provider_ref")
    return ProviderRef(provider=value.get("provider", ""), id=value["id"])


def agrees(*, schema_version: int, provider: str, provider_request_id: str, provider_ref: object) -> bool:
    """Do an operation's two representations say the same? (The backfill's SQL says the
    same thing as ``ledger.sql.upgrades.AGREES_SQL``; tests/ledger/test_provider_ref.py holds them equal.)"""
    if provider_ref is None:
        # Nothing new yet: fine for a version-1 record or one without a provider id at all.
        return provider_request_id == "" or schema_version == OLD
    try:
        ref = parsed(provider_ref)
    except InvalidInput:
        return False
    if ref is None or ref.id != provider_request_id:
        return False
    return provider == "" or ref.provider == provider


def written(phase: str, *, provider: str, ref: ProviderRef | None) -> dict[str, Any]:
    """The columns a writer sets for an operation's provider record in ``phase``: both
    representations (EXPAND keeps the record at version 1, MIGRATE writes version 2), or
    in CONTRACT only the new one (the old column is left empty, to be dropped)."""
    new = ref.as_json() if ref is not None else None
    if phase == UpgradePhase.CONTRACT:
        return {"provider_ref": new, "provider_request_id": "", "schema_version": NEW}
    version = NEW if phase == UpgradePhase.MIGRATE else OLD
    return {"provider_ref": new, "provider_request_id": ref.id if ref is not None else "", "schema_version": version}


def phase_now() -> str:
    """The phase of this change as this process sees it now (cached briefly)."""
    return phase(CHANGE)


def version_for_new(phase: str) -> int:
    """The schema_version of an operation created in ``phase``."""
    return OLD if phase == UpgradePhase.EXPAND else NEW


def disagreement(op: Operation, phase: str) -> tuple[dict[str, str], object] | None:
    """(old, new) when ``op``'s two representations disagree in ``phase``; else None. In
    CONTRACT only the new one is read, so there is nothing to compare."""
    if phase == UpgradePhase.CONTRACT:
        return None
    if agrees(
        schema_version=op.schema_version,
        provider=op.provider,
        provider_request_id=op.provider_request_id,
        provider_ref=op.provider_ref,
    ):
        return None
    return {"provider": op.provider, "provider_request_id": op.provider_request_id}, op.provider_ref


def reference(op: Operation, phase: str) -> ProviderRef | None:
    """The provider record of ``op`` (the dual read). Call ``disagreement`` first where a
    conflict must stop something; here a disagreeing record raises InvalidInput."""
    if disagreement(op, phase) is not None:
        raise InvalidInput(f"operation {op.pk}: provider_request_id and provider_ref disagree", field="provider_ref")
    if op.schema_version >= NEW or phase == UpgradePhase.CONTRACT:
        return parsed(op.provider_ref)
    return legacy(op.provider, op.provider_request_id)


# A record whose representations disagree: (operation id, run id, old, new).
type Conflict = tuple[uuid.UUID, uuid.UUID, dict[str, str], object]


@dataclass(frozen=True)
class Batch:
    last_key: str  # the largest key looked at ("" when the batch was empty)
    scanned: int
    changed: int
    conflicts: list[Conflict]


class ProviderRefBackfill:
    """Version-1 operations to version 2: ``provider_ref`` from ``provider`` and
    ``provider_request_id`` where it is missing (or kept where it agrees), and the version.
    Keyed by the operation id; each batch is one statement (the update and the count), plus
    one read of the records that disagree, which stay at version 1 and are handed back to become StateConflicts after the batch commits (opening one locks its run,
    which a batch never holds)."""

    name = CHANGE
    model = Operation
    describe = "operations: provider_request_id -> provider_ref, schema_version 1 -> 2"

    def batch(self, *, after: str, limit: int, dry_run: bool = False) -> Batch:
        last_key, scanned, changed = sql_upgrades.provider_ref_batch(after=after, limit=limit, dry_run=dry_run)
        if not scanned or last_key is None:
            return Batch(last_key="", scanned=0, changed=0, conflicts=[])
        conflicts = [
            (op_id, run_id, {"provider": provider, "provider_request_id": old}, _json(new))
            for op_id, run_id, provider, old, new in sql_upgrades.provider_ref_conflicts(after=after, upto=last_key)
        ]
        return Batch(last_key=last_key, scanned=scanned, changed=changed, conflicts=conflicts)


def _json(value: object) -> object:
    """A jsonb value from a raw cursor: psycopg decodes it; a text one is decoded here."""
    return json.loads(value) if isinstance(value, str) else value
