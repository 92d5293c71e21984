"""The backfills this build knows, by the name of their schema change."""

from ledger.errors import NotFound
from ledger.services.upgrades.provider_ref import ProviderRefBackfill

BACKFILLS = {ProviderRefBackfill.name: ProviderRefBackfill()}


def spec_for(name: str) -> ProviderRefBackfill:
    spec = BACKFILLS.get(name)
    if spec is None:
        raise NotFound(f"there is no backfill {name!r}; known: {', '.join(sorted(BACKFILLS))}")
    return spec
