"""Celery tasks of the approvals app: thin, idempotent, bounded (the retry policy of
``ledger.tasks.job``)."""

from approvals.services.approvals import approvals_expire
from approvals.services.lookups import cases_look_up
from ledger.tasks import job


@job()
def expire_approvals_task() -> dict[str, int]:
    """PENDING or APPROVED requests past their expiry become EXPIRED (never APPROVED)."""
    return {"expired": approvals_expire()}


@job()
def reconcile_unknown_task() -> dict[str, int]:
    """UNKNOWN effects with a reconciler are looked up at their provider (a bounded batch);
    what it cannot tell goes to people."""
    result = cases_look_up()
    return {
        "claimed": result.claimed,
        "happened": result.happened,
        "did_not_happen": result.did_not_happen,
        "later": result.later,
        "to_people": result.to_people,
        "lost": result.lost,
    }
