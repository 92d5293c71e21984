"""What runs hold and how they end: a worker that vanished with two browser sessions (the
reaper closes them once the jobs run), a connection nobody can close (its cleanup keeps
failing and raises an alert), and a run an operator cancelled."""

from datetime import timedelta

from django.utils import timezone

from console.demo.acting import Acting
from ledger.models import RunLease, RunResource
from ledger.services.fence import leases, runs
from ledger.services.fence.ending import run_cancel
from ledger.services.fleet.workers import worker_create
from ledger.services.lifespan import resources
from ledger.services.lifespan.reaper import resources_reap


def seed(acting: Acting) -> None:
    vanished(acting)
    cleanup_failing(acting)
    run, _ = acting.leased("demo-cancelled")
    run_cancel(tenant=acting.tenant, run_id=run.pk, reason="the customer withdrew the request", actor="user:operator")


def vanished(acting: Acting) -> None:
    leaky, _ = worker_create(tenant=acting.tenant, name="leaky-worker")
    run, _ = runs.run_create(worker=leaky, schema_version=1, external_id="demo-leaky")
    token = leases.lease_acquire(worker=leaky, run_id=run.pk, owner_id="leaky-1", ttl_s=60).fencing_token
    for n in (1, 2):
        resources.resource_attach(
            worker=leaky,
            run_id=run.pk,
            fencing_token=token,
            attach=resources.Attach(
                kind="browser_session", provider="sandbox", handle=f"supplier-portal-{n}", idle_s=600
            ),
        )
    RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))  # it vanished


def cleanup_failing(acting: Acting) -> None:
    run, token = acting.leased("demo-legacy-crm")
    stuck, _ = resources.resource_attach(
        worker=acting.worker,
        run_id=run.pk,
        fencing_token=token,
        attach=resources.Attach(kind="connection", provider="legacy-crm", handle="crm-conn-7"),
    )
    runs.run_complete(worker=acting.worker, run_id=run.pk, fencing_token=token)
    for _ in range(3):  # no driver knows legacy-crm: three failed cleanups raise an alert
        RunResource.objects.filter(pk=stuck.pk).update(next_attempt_at=timezone.now())  # the demo's clock
        resources_reap()
