"""Runs: creation. A run starts with an unowned lease (token 0) and a RUN_CREATED event."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.models import Run, RunLease, Worker
from ledger.services.events import ChainBatch, worker_actor
from ledger.versioning import CURRENT_SCHEMA_VERSION, require_known


def run_create(*, worker: Worker, schema_version: int, external_id: str | None = None) -> tuple[Run, bool]:
    """Create a run for the worker's tenant. Idempotent on ``external_id``: returns
    ``(run, created)``."""
    require_known(schema_version, "request")
    with transaction.atomic():
        if external_id is not None:
            existing = Run.objects.filter(tenant=worker.tenant, external_id=external_id).first()
            if existing is not None:
                return existing, False
        try:
            with transaction.atomic():
                run = Run.objects.create(
                    tenant=worker.tenant, external_id=external_id, schema_version=CURRENT_SCHEMA_VERSION
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
            fields={"external_id": external_id, "schema_version": CURRENT_SCHEMA_VERSION},
        )
        batch.commit()
    return run, True
