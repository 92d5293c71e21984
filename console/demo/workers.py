"""Workers an admin acts on: one that lost its lease (a restart episode) after saving its
progress, then was quarantined; another draining before host maintenance."""

from datetime import timedelta

from django.utils import timezone

from console.demo.acting import Acting
from ledger.models import RunLease
from ledger.services.fence import leases, runs
from ledger.services.fleet.lifecycle import worker_drain, worker_quarantine
from ledger.services.fleet.workers import worker_create
from ledger.services.lifespan.checkpoints import checkpoint_save


def seed(acting: Acting) -> None:
    flaky, _ = worker_create(tenant=acting.tenant, name="flaky-worker")
    run, _ = runs.run_create(worker=flaky, schema_version=1, external_id="demo-flaky")
    flaky_token = leases.lease_acquire(worker=flaky, run_id=run.pk, owner_id="flaky-1", ttl_s=60).fencing_token
    # It saved its progress before it vanished: the rescue worker resumes from page 3.
    checkpoint_save(
        worker=flaky, run_id=run.pk, fencing_token=flaky_token, position="page-3", state={"pages_done": [1, 2, 3]}
    )
    RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))  # the demo's clock
    leases.lease_acquire(worker=acting.worker, run_id=run.pk, owner_id="agent-rescue", ttl_s=3600)
    worker_quarantine(worker_id=flaky.pk, reason="lost its lease and kept writing", name="admin")
    batch, _ = worker_create(tenant=acting.tenant, name="batch-worker")
    run, _ = runs.run_create(worker=batch, schema_version=1, external_id="demo-batch")
    leases.lease_acquire(worker=batch, run_id=run.pk, owner_id="batch-1", ttl_s=3600)
    worker_drain(worker_id=batch.pk, reason="host maintenance tonight", deadline_s=3600, name="admin")
