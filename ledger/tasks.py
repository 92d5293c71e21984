"""Celery tasks: thin wrappers around one service each, safe to run twice at once."""

from celery import shared_task

from ledger.services.leases import leases_reap
from ledger.services.verification import ledger_verify


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5)
def reap_leases_task() -> dict:
    result = leases_reap()
    return {"leases": result.leases, "operations": result.operations, "batches": result.batches}


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5)
def verify_ledger_task(run_id: str | None = None) -> dict:
    """Verify runs whose chain moved (bounded batch), or one run; seals checkpoints."""
    result = ledger_verify(run_ids=[run_id] if run_id else None)
    return {"runs": result.runs, "events": result.events, "broken": result.broken}


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5)
def expire_reservations_task() -> dict:
    """Cost reservations past their TTL become UNKNOWN (bounded batches, SKIP LOCKED)."""
    from ledger.services.costs import reservations_expire

    return {"reservations": reservations_expire()}


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5)
def enforce_drains_task() -> dict:
    """DRAINING workers with no lease left, or past their deadline, become QUIESCED."""
    from ledger.services.workers import workers_drain_enforce

    return {"workers": workers_drain_enforce()}
