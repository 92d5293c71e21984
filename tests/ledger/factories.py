"""Small builders over the real services (no fake rows)."""

from datetime import timedelta

from django.utils import timezone

from ledger.models import RunLease
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, outcomes, runs


def new_run(worker):
    run, _ = runs.run_create(worker=worker, schema_version=1)
    return run


def expire(run) -> None:
    """The test's clock: the lease's expiry moves into the past."""
    RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))


def intended_operation(worker, run, token: int, key: str, effect_class: str = "NON_RETRYABLE", authorize=False):
    """A PLANNED operation under ``token`` (AUTHORIZED with ``authorize``)."""
    op, _ = operations.operation_intend(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="email", action="send", resource="mailto:x@example.com", effect_class=effect_class, idempotency_key=key
        ),
    )
    if authorize:
        return operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
    return op


def dispatched_operation(worker, run, token: int, key: str, effect_class: str = "NON_RETRYABLE"):
    op = intended_operation(worker, run, token, key, effect_class, authorize=True)
    return operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)


def confirm(worker, op, token: int, provider_request_id: str = "p"):
    """The dispatched ``op`` reported CONFIRMED by ``worker`` with ``token``."""
    return outcomes.operation_report_outcome(
        worker=worker,
        operation_id=op.pk,
        fencing_token=token,
        outcome="CONFIRMED",
        provider_request_id=provider_request_id,
    )


def leased_run(worker, owner: str = "owner-a", ttl_s: int = 30):
    run = new_run(worker)
    lease = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id=owner, ttl_s=ttl_s)
    return run, lease.fencing_token
