"""Runs: creation (an unowned lease, token 0, and a RUN_CREATED event) and completion."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.actors import worker_actor
from ledger.errors import NotFound, RunCompleted, WorkerNotAccepting, parse_id
from ledger.models import Run, RunLease, Worker
from ledger.services.core.fencing import Fenced, fenced
from ledger.services.evidence.append import ChainBatch
from ledger.services.evidence.verification import verification_request
from ledger.services.fence.leases import leases_end
from ledger.states import LeaseEnd, RunStatus, WorkerStatus
from ledger.versioning import CURRENT_SCHEMA_VERSION, require_known


def run_create(
    *, worker: Worker, schema_version: int, external_id: str | None = None, parent_run_id: object = None
) -> tuple[Run, bool]:
    """Create a run for the worker's tenant, optionally as the child of another run of the
    tenant (its capabilities then come out of the parent's). Idempotent on ``external_id``:
    returns ``(run, created)``.

    A run is new work: only an ACCEPTING worker may create one (409 WORKER_NOT_ACCEPTING
    for a DRAINING, QUIESCED, STOPPED or QUARANTINED one), as only it may take a lease."""
    require_known(schema_version, "request")
    if worker.status != WorkerStatus.ACCEPTING:
        raise WorkerNotAccepting(f"worker is {worker.status} and cannot create runs")
    parent = None
    if parent_run_id is not None:
        parent = Run.objects.filter(tenant=worker.tenant, pk=parse_id(parent_run_id, "parent run")).first()
        if parent is None:
            raise NotFound("parent run not found")
    with transaction.atomic():
        if external_id is not None:
            existing = Run.objects.filter(tenant=worker.tenant, external_id=external_id).first()
            if existing is not None:
                return existing, False
        try:
            with transaction.atomic():
                run = Run.objects.create(
                    tenant=worker.tenant, external_id=external_id, parent=parent, schema_version=CURRENT_SCHEMA_VERSION
                )
        except IntegrityError:
            existing = Run.objects.filter(tenant=worker.tenant, external_id=external_id).first()
            if existing is None:
                raise
            return existing, False
        RunLease.objects.create(run=run)
        batch = ChainBatch(timezone.now())
        batch.append(
            run,
            "RUN_CREATED",
            actor=worker_actor(worker, "-"),
            fields={
                "external_id": external_id,
                "schema_version": CURRENT_SCHEMA_VERSION,
                **({"parent_run_id": parent.pk} if parent else {}),
            },
        )
        batch.commit()
    return run, True


def run_complete(*, worker: Worker, run_id: object, fencing_token: int) -> Run:
    """The run's terminal transition, by its lease owner. The lease ends with it: effects
    still in flight become UNKNOWN with a case each. The verifier then seals the chain."""

    def write(ctx: Fenced) -> Run:
        run = ctx.run
        if run.status != RunStatus.ACTIVE:
            raise RunCompleted("the run is already completed")
        leases_end(runs=[run], batch=ctx.batch, actor=ctx.actor, end=LeaseEnd.RELEASED)
        Run.objects.filter(pk=run.pk, status=RunStatus.ACTIVE).update(status=RunStatus.COMPLETED, completed_at=ctx.now)
        run.status, run.completed_at = RunStatus.COMPLETED, ctx.now
        ctx.batch.append(
            run,
            "RUN_COMPLETED",
            actor=ctx.actor,
            fields={
                "confirmed": run.n_confirmed,
                "failed": run.n_failed,
                "unknown": run.n_unknown,
                "reconciled": run.n_reconciled,
                "without_terminal_outcome": run.n_dispatched + run.n_unknown,
            },
        )
        verification_request(run_id=run.pk)  # seals the chain once this commits
        return run

    return fenced(worker=worker, run_id=run_id, token=fencing_token, attempted="run.complete", write=write)
