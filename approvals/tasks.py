"""Celery tasks of the approvals app: thin, idempotent, bounded (the retry policy of
``ledger.tasks.job``)."""

from approvals.services.approvals import approvals_expire
from approvals.services.case_timers import cases_enforce_timers
from approvals.services.lookups import cases_look_up
from approvals.services.notifications import notifications_scan
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


@job()
def enforce_case_timers_task() -> dict[str, int]:
    """Claims past their tenant's acknowledge time expire; cases unclaimed past its
    escalation time escalate (and are notified through the webhooks)."""
    result = cases_enforce_timers()
    return {"claims_expired": result.claims_expired, "escalated": result.escalated}


# Named as when it lived in ledger/tasks.py: the beat entry (console/settings.py, "notify-scan")
# and any message already queued under that name keep finding it.
@job(name="ledger.tasks.notify_scan_task")
def notify_scan_task() -> dict[str, int]:
    """Current conditions become webhook deliveries, once per condition and endpoint."""
    result = notifications_scan()
    return {"endpoints": result.endpoints, "created": result.created, "refused": result.refused}
