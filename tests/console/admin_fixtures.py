"""Builders for the admin-page tests, over the real services: credentials with active
leases held by runs, workers in each lifecycle state, and a resource whose cleanup is stuck."""

from django.utils import timezone

from ledger.models import Credential, CredentialLease, RunResource
from ledger.services.authority import credential_leases, credentials
from ledger.services.fleet.lifecycle import worker_drain, worker_quarantine
from ledger.services.fleet.workers import worker_create
from ledger.services.lifespan.resources import Attach, resource_attach, resource_release
from tests.ledger.factories import leased_run

SECRET_REF = "vault:kv/github-bot"


def credential(tenant, principal: str = "github-bot") -> Credential:
    found = Credential.objects.filter(tenant=tenant, principal=principal).first()
    return found or credentials.credential_create(tenant=tenant, principal=principal, secret_ref=SECRET_REF)


def active_leases(identity, count: int, *, principal: str = "github-bot", runs: int = 1) -> list[CredentialLease]:
    """``count`` active leases of ``principal`` spread over ``runs`` leased runs."""
    credential(identity.tenant, principal)
    holders = [leased_run(identity.worker, owner=f"holder-{i}", ttl_s=600) for i in range(runs)]
    issued = []
    for i in range(count):
        run, token = holders[i % runs]
        issued.append(
            credential_leases.credential_lease_issue(
                worker=identity.worker,
                run_id=run.pk,
                fencing_token=token,
                principal=principal,
                actions=["read"],
                resources=["repo:acme/widgets"],
                ttl_s=600,
            )
        )
    return issued


def worker_in(tenant, status: str, name: str):
    """A worker of ``tenant`` brought to ``status`` through the services."""
    worker, _ = worker_create(tenant=tenant, name=name)
    if status == "DRAINING":
        worker_drain(worker_id=worker.pk, reason="maintenance", name="setup")
    elif status == "QUARANTINED":
        worker_quarantine(worker_id=worker.pk, reason="suspicious", name="setup")
    worker.refresh_from_db()
    return worker


def stuck_resource(worker) -> RunResource:
    """A browser session of a leased run whose cleanup failed three times."""
    run, token = leased_run(worker)
    resource, _ = resource_attach(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        attach=Attach(kind="browser_session", provider="portal", handle=f"stuck-{run.pk}"),
    )
    resource_release(worker=worker, resource_id=resource.pk, fencing_token=token)
    RunResource.objects.filter(pk=resource.pk).update(
        state="CLEANUP_FAILED", attempts=3, last_error="no cleanup driver is configured", next_attempt_at=timezone.now()
    )
    resource.refresh_from_db()
    return resource
