"""The phase of each schema change as this process reads it: a row of ``SchemaChange``,
kept for ``UPGRADE_PHASE_CACHE_S`` seconds, so that every writer and reader can ask on each
call without a query each time. Only ``changes.change_move`` moves a phase (and forgets the
cache); this module reads."""

import time

from django.conf import settings

from ledger.models import SchemaChange
from ledger.states import UpgradePhase

_cache: dict[str, tuple[float, str]] = {}


def phase(name: str) -> str:
    """The phase of change ``name``, as this process last read it (at most
    ``UPGRADE_PHASE_CACHE_S`` seconds ago). A database without the row (one migrated by a
    build before the change) is in EXPAND."""
    now = time.monotonic()
    hit = _cache.get(name)
    if hit is not None and now - hit[0] < settings.FENCELINE["UPGRADE_PHASE_CACHE_S"]:
        return hit[1]
    found = SchemaChange.objects.filter(name=name).values_list("phase", flat=True).first()
    current = found or UpgradePhase.EXPAND
    _cache[name] = (now, current)
    return current


def written_versions() -> list[tuple[str, int]]:
    """(change, version) of every change whose new version is being written (MIGRATE or
    CONTRACT): a reader must know that version to meet those records."""
    return [
        (name, to)
        for name, current, to in SchemaChange.objects.values_list("name", "phase", "to_version")
        if current != UpgradePhase.EXPAND
    ]


def phase_forget() -> None:
    """Read every phase again at its next use (after a move; tests)."""
    _cache.clear()
