"""Run leases: acquire, renew, release, and the reaper that sweeps expired ones.

The fencing token of a run grows by one on every ownership change (invariant 1). Losing a
lease (expiry, takeover of an expired lease, release) turns the run's DISPATCHED operations
UNKNOWN and opens a reconciliation case for each, in the same transaction (invariant 4).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.actors import SYSTEM_REAPER, worker_actor
from ledger.errors import InvalidInput, LeaseHeld, LeaseLost, RunCompleted, WorkerNotAccepting
from ledger.models import LeaseGrant, Run, RunLease, Worker
from ledger.services.authority.policy import policy_current
from ledger.services.core.fencing import Fenced, fenced, lock_run, locked_runs
from ledger.services.core.handoff import queues
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.unknown import operations_mark_unknown, operations_orphaned
from ledger.states import CaseReason, LeaseEnd, RunStatus, WorkerStatus

MIN_TTL_S = 1
END_EVENTS = {LeaseEnd.EXPIRED: "LEASE_EXPIRED", LeaseEnd.RELEASED: "LEASE_RELEASED", LeaseEnd.REVOKED: "LEASE_REVOKED"}
END_CASE_REASONS = {
    LeaseEnd.EXPIRED: CaseReason.LEASE_LOST,
    LeaseEnd.RELEASED: CaseReason.LEASE_RELEASED,
    LeaseEnd.REVOKED: CaseReason.LEASE_REVOKED,
}
MAX_TTL_S = 3600


def _check_ttl(ttl_s: int) -> None:
    if type(ttl_s) is not int or not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise InvalidInput(f"ttl_s must be an integer from {MIN_TTL_S} to {MAX_TTL_S}")


def _touch(worker: Worker) -> None:
    Worker.objects.filter(pk=worker.pk).update(last_seen_at=timezone.now())


def lease_acquire(*, worker: Worker, run_id: object, owner_id: str, ttl_s: int) -> RunLease:
    """Take the run's lease if nobody holds it. Taking over an expired lease first ends the
    old ownership (its DISPATCHED operations become UNKNOWN) and then issues token + 1."""
    _check_ttl(ttl_s)
    if worker.status != WorkerStatus.ACCEPTING:
        raise WorkerNotAccepting(f"worker is {worker.status} and cannot take new leases")
    with transaction.atomic():
        # The worker row first, then the run (the lock order of worker_quarantine): an
        # acquire racing a quarantine either commits first, and the quarantine then revokes
        # the new lease, or sees the worker no longer ACCEPTING.
        if not Worker.objects.filter(pk=worker.pk, status=WorkerStatus.ACCEPTING).update(last_seen_at=timezone.now()):
            raise WorkerNotAccepting("the worker stopped accepting new leases")
        run = lock_run(tenant=worker.tenant, run_id=run_id)
        if run.status != RunStatus.ACTIVE:
            raise RunCompleted("the run is completed; it takes no new lease")
        now = timezone.now()
        lease = run.lease
        if lease.owner_id is not None:
            # An owned lease has an expiry (the check constraint lease_owned_has_expiry_and_token).
            if lease.expires_at is None:
                raise AssertionError("an owned lease has no expires_at")
            if lease.expires_at > now:
                raise LeaseHeld(
                    f"the lease is held until {lease.expires_at.isoformat()}",
                    expires_at=lease.expires_at,
                )
        actor = worker_actor(worker, owner_id)
        batch = ChainBatch(now)
        previous_owner = lease.owner_id
        if previous_owner is not None:
            leases_end(runs=[run], batch=batch, actor=actor, end=LeaseEnd.EXPIRED)
        previous_token = lease.fencing_token
        token = previous_token + 1
        expires_at = now + timedelta(seconds=ttl_s)
        won = RunLease.objects.filter(run=run, fencing_token=previous_token).update(
            owner_id=owner_id,
            worker=worker,
            fencing_token=token,
            acquired_at=now,
            expires_at=expires_at,
            last_renewed_at=now,
            end_reason=None,
        )
        if won != 1:  # impossible while the row is locked
            raise LeaseHeld("the lease changed hands concurrently")
        LeaseGrant.objects.create(
            run=run,
            fencing_token=token,
            owner_id=owner_id,
            worker=worker,
            acquired_at=now,
            previous_owner_id=previous_owner,
        )
        lease.owner_id, lease.worker, lease.fencing_token = owner_id, worker, token
        lease.acquired_at, lease.expires_at, lease.last_renewed_at = now, expires_at, now
        batch.append(
            run,
            "LEASE_ACQUIRED",
            actor=actor,
            fields={
                "owner_id": owner_id,
                "fencing_token": token,
                "previous_token": previous_token,
                "expires_at": expires_at,
            },
        )
        batch.commit()
    return lease


def lease_renew(*, worker: Worker, run_id: object, owner_id: str, fencing_token: int, ttl_s: int) -> RunLease:
    """Extend the lease of its current owner. An expired lease cannot be renewed, and neither
    can the lease of a child run whose parent is no longer ACTIVE (409 RUN_COMPLETED): a
    sub-agent does not outlive the run that started it.

    A worker renews only while it progresses (article "Agent Lifespan Management"): when the
    run has made no progress (``Run.last_progress_at``, or the lease's start) for longer than
    the policy's ``idle_limit_s``, the renewal ends the lease instead, as an expiry (its
    DISPATCHED effects become UNKNOWN with a case), and answers 409 LEASE_LOST ``idle``."""
    _check_ttl(ttl_s)
    _, policy = policy_current(tenant=worker.tenant)
    idle_limit = policy.get("idle_limit_s")

    def write(ctx: Fenced) -> RunLease | None:
        parent = ctx.run.parent_id
        if parent is not None and not Run.objects.filter(pk=parent, status=RunStatus.ACTIVE).exists():
            raise RunCompleted("the parent run is completed; its child's lease is not renewed")
        if idle_limit is not None:
            since = max(filter(None, (ctx.run.last_progress_at, ctx.lease.acquired_at)))
            if (ctx.now - since).total_seconds() > idle_limit:
                leases_end(runs=[ctx.run], batch=ctx.batch, actor=ctx.actor, end=LeaseEnd.EXPIRED, reason="idle")
                return None
        expires_at = ctx.now + timedelta(seconds=ttl_s)
        RunLease.objects.filter(run=ctx.run, fencing_token=ctx.token).update(
            expires_at=expires_at, last_renewed_at=ctx.now
        )
        ctx.lease.expires_at, ctx.lease.last_renewed_at = expires_at, ctx.now
        ctx.batch.append(
            ctx.run,
            "LEASE_RENEWED",
            actor=ctx.actor,
            fields={"fencing_token": ctx.token, "expires_at": expires_at},
        )
        return ctx.lease

    lease = fenced(
        worker=worker,
        run_id=run_id,
        token=fencing_token,
        owner_id=owner_id,
        attempted="lease.renew",
        write=write,
        refusal=LeaseLost,
    )
    _touch(worker)
    if lease is None:  # the idle limit ended it; that end is committed
        raise LeaseLost("idle")
    return lease


def lease_release(*, worker: Worker, run_id: object, owner_id: str, fencing_token: int) -> RunLease:
    """Give the lease up. Effects dispatched under it and not yet reported become UNKNOWN."""

    def write(ctx: Fenced) -> RunLease:
        leases_end(runs=[ctx.run], batch=ctx.batch, actor=ctx.actor, end=LeaseEnd.RELEASED)
        return ctx.lease

    return fenced(
        worker=worker,
        run_id=run_id,
        token=fencing_token,
        owner_id=owner_id,
        attempted="lease.release",
        write=write,
        refusal=LeaseLost,
    )


def leases_end(*, runs: list[Run], batch: ChainBatch, actor: str, end: LeaseEnd, reason: str = "") -> int:
    """End the current ownership of ``runs`` (locked by the caller) with set-based updates:
    clear the owners, close their history rows, void the approvals asked under the old
    token, move their DISPATCHED operations to UNKNOWN with a case each. Returns the number
    of operations moved."""
    run_ids = [run.pk for run in runs]
    RunLease.objects.filter(run_id__in=run_ids).update(owner_id=None, worker=None, expires_at=batch.now, end_reason=end)
    LeaseGrant.objects.filter(run_id__in=run_ids, ended_at__isnull=True).update(ended_at=batch.now, end_reason=end)
    event_type = END_EVENTS[end]
    for run in runs:
        batch.append(
            run,
            event_type,
            actor=actor,
            fields={
                "owner_id": run.lease.owner_id,
                "fencing_token": run.lease.fencing_token,
                **({"reason": reason} if reason else {}),
            },
        )
        run.lease.owner_id, run.lease.worker, run.lease.expires_at, run.lease.end_reason = None, None, batch.now, end
    queues().approvals_void_for_runs(runs=runs, batch=batch, actor=actor)
    orphans = operations_orphaned(run_ids=run_ids)
    reason = END_CASE_REASONS[end]
    operations_mark_unknown(
        operations=orphans,
        runs={run.pk: run for run in runs},
        batch=batch,
        actor=actor,
        reason=reason,
    )
    return len(orphans)


@dataclass
class ReapResult:
    leases: int = 0
    operations: int = 0
    batches: int = 0


def leases_reap(*, batch_size: int | None = None, progress: Callable[[ReapResult], None] | None = None) -> ReapResult:
    """Sweep expired leases in bounded batches. Each batch claims its runs with
    ``FOR UPDATE SKIP LOCKED``, so two reapers at once split the work instead of doing it
    twice, and an acquire in progress is never waited on."""
    batch_size = batch_size or settings.FENCELINE["REAPER_BATCH_SIZE"]
    result = ReapResult()
    while True:
        with transaction.atomic():
            now = timezone.now()
            runs = locked_runs({"owner_id__isnull": False, "expires_at__lte": now}, skip_locked=True, limit=batch_size)
            if not runs:
                break
            batch = ChainBatch(now)
            moved = leases_end(runs=runs, batch=batch, actor=SYSTEM_REAPER, end=LeaseEnd.EXPIRED)
            batch.commit()
        result.leases += len(runs)
        result.operations += moved
        result.batches += 1
        if progress is not None:
            progress(result)
        if len(runs) < batch_size:
            break
    return result
