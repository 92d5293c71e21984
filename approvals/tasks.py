"""Celery tasks of the approvals app: thin, idempotent, bounded."""

from celery import shared_task

from approvals.services.approvals import approvals_expire


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5)
def expire_approvals_task() -> dict:
    """PENDING or APPROVED requests past their expiry become EXPIRED (never APPROVED)."""
    return {"expired": approvals_expire()}
