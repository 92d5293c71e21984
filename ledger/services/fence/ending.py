"""How a run ends: completion by its lease owner, cancellation (by its worker, its parent's
worker or a person), and its maximum runtime (article "Agent Lifespan Management":
"creation limits, idle expiry, maximum runtime, cancellation, and cleanup ownership").

A cancelled run goes ACTIVE -> CANCELLING -> CANCELLED; a run past its deadline takes the
same path and ends TIMED_OUT. From the cancel on, the run takes no new work (409
RUN_CANCELLED for intents, authorizations, dispatches, retries, capabilities and credential
leases); effects already DISPATCHED may still report until the policy's ``cancel_grace_s``
is over. The run then finishes: its lease ends (what is still DISPATCHED becomes UNKNOWN
with a case, reason RUN_CANCELLED), and its children are cancelled with it.

Every end takes the article's flow 5 order: the terminal status is committed first, then
the run's credential leases and capability budgets are revoked, then its resources are
handed to the reaper. All of it happens under the run's lock, in one transaction.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.actors import SYSTEM_LIMITS, worker_actor
from ledger.errors import DomainError, Forbidden, RunCompleted
from ledger.models import Run, RunLease, Tenant, Worker
from ledger.services.authority.capabilities import capabilities_end_with_run
from ledger.services.authority.credential_leases import credential_leases_end_with_run
from ledger.services.authority.policy import policy_current
from ledger.services.core.decisions import decision_reason
from ledger.services.core.fencing import Fenced, lock_run, locked_runs, run_cancelled
from ledger.services.evidence.append import ChainBatch
from ledger.services.evidence.verification import verification_request
from ledger.services.fence.lease_end import leases_end
from ledger.services.lifespan.instances import instances_end, instances_plan
from ledger.states import CANCEL_ENDS, LeaseEnd, RunStatus

TIMEOUT_REASON = "maximum runtime reached"


def run_finish(
    *, run: Run, batch: ChainBatch, actor: str, status: RunStatus, fields: dict[str, Any] | None = None
) -> None:
    """The terminal transition of a locked run, in flow 5 order (see the module text)."""
    plan = instances_plan(runs=[run], lost=False)  # taken while the lease is still held
    if run.lease.owner_id is not None:
        end = LeaseEnd.RELEASED if status == RunStatus.COMPLETED else LeaseEnd.CANCELLED
        leases_end(runs=[run], batch=batch, actor=actor, end=end, hand_back=False)
    Run.objects.filter(pk=run.pk, status=run.status).update(status=status, completed_at=batch.now)
    run.status, run.completed_at = status, batch.now
    batch.append(
        run,
        f"RUN_{status}",
        actor=actor,
        fields={
            "confirmed": run.n_confirmed,
            "failed": run.n_failed,
            "unknown": run.n_unknown,
            "reconciled": run.n_reconciled,
            "without_terminal_outcome": run.n_dispatched + run.n_unknown,
            **({"instance_state": plan[run.pk].value} if run.pk in plan else {}),
            **(fields or {}),
        },
    )
    credential_leases_end_with_run(run=run, batch=batch, actor=actor)
    capabilities_end_with_run(run=run, batch=batch, actor=actor)
    instances_end(runs=[run], plan=plan, batch=batch, actor=actor, reason=status.lower())
    verification_request(run_id=run.pk)  # seals the chain once this commits


def _children(runs: list[Run]) -> list[Run]:
    ids = list(Run.objects.filter(parent_id__in=[run.pk for run in runs], status=RunStatus.ACTIVE).values_list("pk"))
    if not ids:
        return []
    # Parents are locked before their children, as every cancel does: no lock cycle.
    return [run for run in locked_runs({"run_id__in": [pk for (pk,) in ids]}) if run.status == RunStatus.ACTIVE]


def runs_cancel(*, runs: list[Run], batch: ChainBatch, actor: str, reason: str, ending: RunStatus) -> int:
    """ACTIVE -> CANCELLING for locked ``runs`` and then, down the tree, their ACTIVE
    children (reason "parent cancelled"). A run with nothing DISPATCHED finishes at once.
    Returns how many runs were cancelled."""
    if ending not in CANCEL_ENDS:
        raise AssertionError(f"a cancellation ends CANCELLED or TIMED_OUT, not {ending}")
    cancelled = 0
    grace_s: dict[int, int] = {}  # per tenant: one policy read however many runs go
    while runs:
        for run in runs:
            if run.status != RunStatus.ACTIVE:
                continue
            if run.tenant_id not in grace_s:
                grace_s[run.tenant_id] = policy_current(tenant=run.tenant)[1]["cancel_grace_s"]
            grace_until = batch.now + timedelta(seconds=grace_s[run.tenant_id])
            Run.objects.filter(pk=run.pk, status=RunStatus.ACTIVE).update(
                status=RunStatus.CANCELLING,
                ending=ending,
                cancel_requested_at=batch.now,
                cancel_requested_by=actor,
                cancel_reason=reason,
                cancel_grace_until=grace_until,
            )
            run.status, run.ending, run.cancel_requested_at = RunStatus.CANCELLING, ending, batch.now
            run.cancel_requested_by, run.cancel_reason, run.cancel_grace_until = actor, reason, grace_until
            batch.append(
                run,
                "RUN_CANCELLING",
                actor=actor,
                fields={
                    "ending": ending.value,
                    "reason": reason,
                    "grace_until": grace_until,
                    "in_flight": run.n_dispatched,
                },
            )
            cancelled += 1
            if run.n_dispatched == 0:
                run_finish(run=run, batch=batch, actor=actor, status=ending, fields={"reason": reason})
        runs, reason = _children(runs), "parent cancelled"
    return cancelled


def _finish_cancelled(run: Run, batch: ChainBatch, actor: str) -> None:
    run_finish(run=run, batch=batch, actor=actor, status=RunStatus(run.ending), fields={"reason": run.cancel_reason})


@dataclass(frozen=True)
class RunGate:
    """The :class:`ledger.services.core.fencing.Ending` of the fence room's writes."""

    new_work: bool

    def before(self, ctx: Fenced) -> DomainError | None:
        run = ctx.run
        if run.status == RunStatus.ACTIVE and run.deadline_at is not None and run.deadline_at <= ctx.now:
            runs_cancel(
                runs=[run], batch=ctx.batch, actor=SYSTEM_LIMITS, reason=TIMEOUT_REASON, ending=RunStatus.TIMED_OUT
            )
        if run.status == RunStatus.CANCELLING and run.cancel_grace_until and run.cancel_grace_until <= ctx.now:
            _finish_cancelled(run, ctx.batch, SYSTEM_LIMITS)
        if run.status == RunStatus.COMPLETED:
            return RunCompleted("the run is completed")
        if run.status in CANCEL_ENDS or (self.new_work and run.status == RunStatus.CANCELLING):
            return run_cancelled(run)
        return None

    def after(self, ctx: Fenced) -> None:
        run = ctx.run
        if run.status == RunStatus.CANCELLING and run.n_dispatched == 0:
            _finish_cancelled(run, ctx.batch, ctx.actor)


NEW_WORK = RunGate(new_work=True)  # intents, authorize, dispatch, retry
IN_FLIGHT = RunGate(new_work=False)  # outcomes, events, renew, release, completion


def _worker_may_cancel(run: Run, worker: Worker, now: datetime) -> bool:
    """The worker holds the run's lease, or the lease of the run's parent."""

    def holds(lease: RunLease) -> bool:
        return (
            lease.worker_id == worker.pk
            and lease.owner_id is not None
            and lease.expires_at is not None
            and lease.expires_at > now
        )

    if holds(run.lease):
        return True
    parent_lease = RunLease.objects.filter(run_id=run.parent_id).first() if run.parent_id else None
    return parent_lease is not None and holds(parent_lease)


def run_cancel(*, tenant: Tenant, run_id: object, reason: object, actor: str = "", worker: Worker | None = None) -> Run:
    """Cancel a run (and its children) for a person (``actor`` is ``user:…``, their role
    checked by the caller) or a worker that holds the run's lease or its parent's (403
    otherwise). Cancelling a CANCELLING or CANCELLED run again changes nothing; a
    COMPLETED or TIMED_OUT run cannot be cancelled (409)."""
    reason = decision_reason(reason)
    with transaction.atomic():
        run = lock_run(tenant=tenant, run_id=run_id)
        now = timezone.now()
        if run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED):
            return run  # already under way: nothing changes (any worker of the tenant may read it)
        if worker is not None:
            if not _worker_may_cancel(run, worker, now):
                raise Forbidden("only the worker holding this run's lease, or its parent's, may cancel it")
            actor = worker_actor(worker, run.lease.owner_id or "parent")
        if run.status != RunStatus.ACTIVE:
            raise RunCompleted(f"the run is {run.status.lower().replace('_', ' ')}; it cannot be cancelled")
        batch = ChainBatch(now)
        runs_cancel(runs=[run], batch=batch, actor=actor, reason=reason, ending=RunStatus.CANCELLED)
        batch.commit()
    return run


@dataclass
class LimitsResult:
    timed_out: int = 0
    finished: int = 0


def runs_enforce_limits(*, batch_size: int | None = None) -> LimitsResult:
    """The limits job: ACTIVE runs past their maximum runtime are cancelled (TIMED_OUT);
    CANCELLING runs past their grace finish. Set-based batches, claimed with SKIP LOCKED
    (a run a worker is writing to is left for the next pass, or for its own next call)."""
    batch_size = batch_size or settings.FENCELINE["REAPER_BATCH_SIZE"]
    result = LimitsResult()
    for status, due in (
        (RunStatus.ACTIVE, "run__deadline_at__lte"),
        (RunStatus.CANCELLING, "run__cancel_grace_until__lte"),
    ):
        while True:
            with transaction.atomic():
                now = timezone.now()
                runs = locked_runs({"run__status": status, due: now}, skip_locked=True, limit=batch_size)
                batch = ChainBatch(now)
                for run in runs:
                    if status == RunStatus.ACTIVE:
                        runs_cancel(
                            runs=[run],
                            batch=batch,
                            actor=SYSTEM_LIMITS,
                            reason=TIMEOUT_REASON,
                            ending=RunStatus.TIMED_OUT,
                        )
                        result.timed_out += 1
                    elif run.status == RunStatus.CANCELLING:
                        _finish_cancelled(run, batch, SYSTEM_LIMITS)
                        result.finished += 1
                batch.commit()
            if len(runs) < batch_size:
                break
    return result
