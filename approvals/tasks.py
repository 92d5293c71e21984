"""Celery tasks of the approvals app: thin, idempotent, bounded (the retry policy of
``ledger.tasks.job``)."""

from approvals.services.approvals import approvals_expire
from ledger.tasks import job


@job()
def expire_approvals_task() -> dict[str, int]:
    """PENDING or APPROVED requests past their expiry become EXPIRED (never APPROVED)."""
    return {"expired": approvals_expire()}
