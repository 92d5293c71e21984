"""Celery tasks: thin wrappers around one service each, safe to run twice at once."""

from celery import shared_task

from ledger.services.leases import leases_reap


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5)
def reap_leases_task() -> dict:
    result = leases_reap()
    return {"leases": result.leases, "operations": result.operations, "batches": result.batches}
