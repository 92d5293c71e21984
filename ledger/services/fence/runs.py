"""Runs: creation (an unowned lease, token 0, and a RUN_CREATED event) and completion."""

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.actors import worker_actor
from ledger.errors import Denied, InvalidInput, NotFound, WorkerNotAccepting, parse_id
from ledger.models import Run, RunLease, Tenant, Worker
from ledger.services.core.fencing import Fenced, fenced
from ledger.services.core.policy_documents import policy_document
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.ending import IN_FLIGHT, run_finish
from ledger.sql import rows as sql_rows
from ledger.states import RunStatus, WorkerStatus
from ledger.versioning import CURRENT_SCHEMA_VERSION, require_known


def run_create(
    *,
    worker: Worker,
    schema_version: int,
    external_id: str | None = None,
    parent_run_id: object = None,
    max_runtime_s: int | None = None,
) -> tuple[Run, bool]:
    """Create a run for the worker's tenant, optionally as the child of another run of the
    tenant (its capabilities then come out of the parent's). Idempotent on ``external_id``:
    returns ``(run, created)``.

    The run times out (TIMED_OUT) once it is older than the policy's ``max_runtime_s``, or
    the lower ``max_runtime_s`` asked here (a higher one is refused: 403 DENY_POLICY naming the field).
    A child never outlives its parent's deadline either.

    A run is new work: only an ACCEPTING worker may create one (409 WORKER_NOT_ACCEPTING
    for a DRAINING, QUIESCED, STOPPED or QUARANTINED one), as only it may take a lease."""
    require_known(schema_version, "request")
    if worker.status != WorkerStatus.ACCEPTING:
        raise WorkerNotAccepting(f"worker is {worker.status} and cannot create runs")
    tenant = worker.tenant
    runtime_s = _runtime_s(tenant, max_runtime_s)
    parent = _parent_run(tenant, parent_run_id)
    with transaction.atomic():
        if external_id is not None:
            existing = Run.objects.filter(tenant=tenant, external_id=external_id).first()
            if existing is not None:
                return existing, False
        now = timezone.now()
        run = Run(
            tenant=tenant,
            external_id=external_id,
            parent=parent,
            schema_version=CURRENT_SCHEMA_VERSION,
            deadline_at=_deadline(now, runtime_s, parent),
        )
        batch = ChainBatch(now)
        batch.append(
            run,
            "RUN_CREATED",
            actor=worker_actor(worker, "-"),
            fields={
                "external_id": external_id,
                "schema_version": CURRENT_SCHEMA_VERSION,
                "deadline_at": run.deadline_at,
                **({"parent_run_id": parent.pk} if parent else {}),
            },
        )
        # The run is inserted with its chain head already at its first event. Only an external
        # id can meet another run's (the same id asked at this moment): that insert may
        # conflict, and then that run is the answer.
        if not sql_rows.insert(run, conflict=sql_rows.ANY_KEY if external_id is not None else ()):
            existing = Run.objects.filter(tenant=tenant, external_id=external_id).first()
            if existing is None:
                raise IntegrityError(f"run {run.pk} was not inserted and its external id is not taken")
            return existing, False
        sql_rows.insert(RunLease(run=run))
        batch.commit()
    return run, True


def _runtime_s(tenant: Tenant, max_runtime_s: int | None) -> int | None:
    """The run's maximum runtime: the ``max_runtime_s`` asked, at most the policy's (a higher
    one is refused), else the policy's; None for none."""
    limit: int | None = policy_document(tenant, tenant.policy_version).get("max_runtime_s")  # as loaded with the worker
    if max_runtime_s is not None and (type(max_runtime_s) is not int or max_runtime_s < 1):
        raise InvalidInput("max_runtime_s must be a positive integer", field="max_runtime_s")
    if max_runtime_s is not None and limit is not None and max_runtime_s > limit:
        raise Denied("DENY_POLICY", f"the policy allows a run at most {limit} s (max_runtime_s)", field="max_runtime_s")
    return max_runtime_s or limit


def _parent_run(tenant: Tenant, parent_run_id: object) -> Run | None:
    """The tenant's run named as the parent (404 if there is none), or None."""
    if parent_run_id is None:
        return None
    parent = Run.objects.filter(tenant=tenant, pk=parse_id(parent_run_id, "parent run")).first()
    if parent is None:
        raise NotFound("parent run not found")
    return parent


def _deadline(now: datetime, runtime_s: int | None, parent: Run | None) -> datetime | None:
    """When a run started ``now`` times out: after its runtime, and never after its parent's deadline."""
    deadlines = [now + timedelta(seconds=runtime_s)] if runtime_s else []
    if parent is not None and parent.deadline_at is not None:
        deadlines.append(parent.deadline_at)
    return min(deadlines) if deadlines else None


def run_complete(*, worker: Worker, run_id: object, fencing_token: int) -> Run:
    """The run's terminal transition, by its lease owner. The lease ends with it: effects
    still in flight become UNKNOWN with a case each. Then the run's credential leases and
    capabilities are revoked and its resources handed to the reaper (ending.run_finish).
    A CANCELLING run the worker completes ends as its cancellation said (CANCELLED or
    TIMED_OUT), not COMPLETED."""

    def write(ctx: Fenced) -> Run:
        run = ctx.run
        status = RunStatus(run.ending) if run.status == RunStatus.CANCELLING else RunStatus.COMPLETED
        extra = {"reason": run.cancel_reason} if run.status == RunStatus.CANCELLING else {}
        run_finish(run=run, batch=ctx.batch, actor=ctx.actor, status=status, fields=extra)
        return run

    return fenced(
        worker=worker,
        run_id=run_id,
        fencing_token=fencing_token,
        attempted="run.complete",
        write=write,
        ending=IN_FLIGHT,
    )
