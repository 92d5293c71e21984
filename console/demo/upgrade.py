"""The upgrade window of operation.provider_ref (EXPAND): a report in the new form
(provider_ref) is dual-written; then a process of the old build rewrites the bare id of
another operation, so its two representations disagree. The dry-run backfill counts it, and
it is opened as a StateConflict, as a reader that must act on it opens one (a lookup, a case
resolution, the backfill): the run's automation stops until a person decides on /upgrades/."""

from collections.abc import Callable

from console.demo.acting import Acting
from ledger.models import Operation
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.backfill import backfill_run
from ledger.services.upgrades.conflicts import conflict_open
from ledger.states import Outcome


def seed(acting: Acting, say: Callable[[str], None]) -> None:
    run, token = acting.leased("demo-upgrade")
    acting.outcome(
        acting.dispatch(run, token, "demo:issue:21"), token, Outcome.CONFIRMED, provider_ref={"id": "gh-2001"}
    )
    run, token = acting.leased("demo-upgrade-conflict")
    op = acting.outcome(
        acting.dispatch(run, token, "demo:issue:22"), token, Outcome.CONFIRMED, provider_request_id="gh-2002"
    )
    Operation.objects.filter(pk=op.pk).update(provider_request_id="gh-2003")  # the old build's write
    seen = backfill_run(provider_ref.CHANGE, dry_run=True)
    conflict_open(operation_id=op.pk, found_by="demo: the backfill's dry run")
    say(
        f"upgrade window: operation.provider_ref in {provider_ref.phase_now()}; the dry-run backfill would move "
        f"{seen.changed} of {seen.scanned} operations and found {seen.conflicts} conflict (see /upgrades/)"
    )
