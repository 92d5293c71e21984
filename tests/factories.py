"""Builders over the real services (no fake rows): tenants and workers, users with a role,
runs and leases, operations at each phase, policies, credentials, resources and endpoints.

The suite's cast of tenants and users is built from these in tests/conftest.py; a test that
needs something the cast does not have builds it here. Tools that are not builders
(assertions, tampering, processes, clients) are in tests/helpers.py."""

import os
import uuid
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.models import ApprovalRequest, ReconciliationCase
from ledger.errors import ApprovalRequired
from ledger.models import Credential, CredentialLease, Operation, Run, RunLease, RunResource, StateConflict
from ledger.services.authority import credential_leases, credentials
from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, outcomes
from ledger.services.fence.runs import run_create
from ledger.services.fleet.boots import BootReport, worker_boot
from ledger.services.fleet.lifecycle import worker_drain, worker_quarantine
from ledger.services.fleet.workers import worker_create
from ledger.services.lifespan.resources import Attach, resource_attach, resource_release
from ledger.services.notifications.endpoints import endpoint_create
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.tenants import tenant_ensure
from ledger.services.upgrades.conflicts import conflict_open

# --- tenants and workers ------------------------------------------------------------------


class WorkerIdentity:
    """A worker of a tenant and the bearer token it calls the API with."""

    def __init__(self, worker, token):
        self.worker = worker
        self.token = token
        self.tenant = worker.tenant


def make_worker(tenant_slug: str, name: str) -> WorkerIdentity:
    """A new worker named ``name`` of the tenant ``tenant_slug`` (made when missing)."""
    tenant, _ = tenant_ensure(slug=tenant_slug)
    worker, token = worker_create(tenant=tenant, name=name)
    return WorkerIdentity(worker, token)


def worker_in(tenant, status: str, name: str):
    """A worker of ``tenant`` brought to ``status`` (ACTIVE, DRAINING, QUARANTINED) through the services."""
    worker, _ = worker_create(tenant=tenant, name=name)
    if status == "DRAINING":
        worker_drain(worker_id=worker.pk, reason="maintenance", name="setup")
    elif status == "QUARANTINED":
        worker_quarantine(worker_id=worker.pk, reason="suspicious", name="setup")
    worker.refresh_from_db()
    return worker


READY = {d: {"ok": True, "evidence": {}} for d in ("runtime", "state", "credentials", "outbound_delivery", "admission")}


def booted(worker, *, reads: int = 1, boot_id: str | None = None, **report):
    """A boot report from the worker's process, every readiness domain ok unless ``report``
    says otherwise: its build reads schema versions up to ``reads``."""
    fields = {
        "boot_id": boot_id or f"boot-{worker.pk}-{reads}-{os.urandom(3).hex()}",
        "config_hash": "cfg-1",
        "code_version": f"build-v{reads}",
        "state_schema_version": reads,
        "pid": 4242,
        "host": "test-host",
        "readiness": READY,
    }
    return worker_boot(worker=worker, report=BootReport(**(fields | report)))


# --- users with a role ----------------------------------------------------------------------

ROLES = ("viewer", "operator", "approver", "admin")


def user_with(role: str | None, tenant, name: str | None = None):
    """A console user with exactly ``role`` on ``tenant`` (None: a user with no role anywhere)."""
    name = name or f"q-{role or 'none'}-{tenant.slug}"
    if role is None:
        users = get_user_model().objects
        return users.filter(username=name).first() or users.create_user(username=name)
    user, _ = role_grant(username=name, tenant=tenant, role=role)
    return user


# --- runs and leases ------------------------------------------------------------------------


def new_run(worker):
    """A new run of ``worker``, nobody holding its lease."""
    run, _ = run_create(worker=worker, schema_version=1)
    return run


def leased_run(worker, owner: str = "owner-a", ttl_s: int = 30):
    """A new run of ``worker`` whose lease ``owner`` holds: (run, fencing token)."""
    run = new_run(worker)
    lease = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id=owner, ttl_s=ttl_s)
    return run, lease.fencing_token


def expire(*runs) -> int:
    """The test's clock: the leases' expiry (of runs or run ids) moves into the past; how many moved."""
    return RunLease.objects.filter(run__in=runs).update(expires_at=timezone.now() - timedelta(seconds=1))


def bulk_runs(tenant, count: int, *, start=None, **fields) -> list[Run]:
    """``count`` runs (each with its lease row) one second apart, newest last: many rows
    fast, for pagination and query-count tests."""
    start = start or timezone.now() - timedelta(days=1)
    made = Run.objects.bulk_create(
        [Run(id=uuid.uuid4(), tenant=tenant, schema_version=1, **fields) for _ in range(count)]
    )
    # created_at is auto_now_add: set distinct times afterwards, one per run.
    for i, run in enumerate(made):
        run.created_at = start + timedelta(seconds=i)
    Run.objects.bulk_update(made, ["created_at"])
    RunLease.objects.bulk_create([RunLease(run=run, schema_version=1) for run in made])
    return made


# --- operations at each phase -----------------------------------------------------------------


def intended_operation(worker, run, token: int, key: str, effect_class: str = "NON_RETRYABLE", authorize=False):
    """A PLANNED email under ``token`` (AUTHORIZED with ``authorize``)."""
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


def planned_op(identity, run, token, key, *, estimate=None, provider="", effect_class="IDEMPOTENT") -> Operation:
    """A PLANNED model call with a worst-case cost ``estimate`` (cents) and a ``provider``."""
    op, _ = operations.operation_intend(
        worker=identity.worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="llm",
            action="complete",
            resource="model:summarize",
            effect_class=effect_class,
            idempotency_key=key,
            provider=provider,
            estimated_cost_cents=estimate,
        ),
    )
    return op


def dispatched_operation(worker, run, token: int, key: str, effect_class: str = "NON_RETRYABLE"):
    """A DISPATCHED email under ``token``: its effect is in flight."""
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


def dispatched_payment(worker, key: str, effect_class: str = "NON_RETRYABLE"):
    """A DISPATCHED charge (worst case 1200 cents) with the sandbox payments provider, whose
    reconciler can look it up (the ``sandbox`` fixture), in a new leased run: (run, token, operation)."""
    run, token = leased_run(worker)
    op, _ = operations.operation_intend(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="payments",
            action="charge",
            resource="customer:1",
            effect_class=effect_class,
            idempotency_key=key,
            provider="sandbox-payments",
            estimated_cost_cents=1200,
        ),
    )
    operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)
    return run, token, op


def unknown_payment(worker, key: str, **kwargs):
    """A sandbox charge (``dispatched_payment``) the worker reported UNKNOWN: (run, operation, case)."""
    run, token, op = dispatched_payment(worker, key, **kwargs)
    outcomes.operation_report_outcome(worker=worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
    case = ReconciliationCase.objects.get(operation=op)
    return run, op, case


def unknown_case(worker, key: str = "timeout-1") -> ReconciliationCase:
    """One effect the worker reported as UNKNOWN (the provider timed out): its open case."""
    run, token = leased_run(worker)
    op = dispatched_operation(worker, run, token, key)
    outcomes.operation_report_outcome(
        worker=worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN", error_code="READ_TIMEOUT"
    )
    return ReconciliationCase.objects.get(operation=op)


def unknown_cases(worker, count: int, *, prefix: str = "case") -> list[ReconciliationCase]:
    """``count`` operations dispatched in one run whose lease is then released: each outcome
    is UNKNOWN and opens a case (one service call per step, as a worker would)."""
    run, token = leased_run(worker)
    for i in range(count):
        dispatched_operation(worker, run, token, f"{prefix}-{i}")
    leases.lease_release(worker=worker, run_id=run.pk, owner_id="owner-a", fencing_token=token)
    return list(ReconciliationCase.objects.filter(run=run).order_by("opened_at", "id"))


def pending_approvals(worker, count: int = 1, *, prefix: str = "charge") -> list[ApprovalRequest]:
    """``count`` payments the tenant's policy puts before a person, each waiting on a request."""
    set_policy(worker.tenant, reason="every payment is approved by a person", human_approval_tools=["payments"])
    run, token = leased_run(worker, owner="payer")
    ids = []
    for i in range(count):
        op, _ = operations.operation_intend(
            worker=worker,
            run_id=run.pk,
            fencing_token=token,
            intent=Intent(
                tool="payments",
                action="charge",
                resource="customer:881",
                effect_class="NON_RETRYABLE",
                idempotency_key=f"{prefix}-{i}",
                args_digest="sha256:abc123",
            ),
        )
        try:
            operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
        except ApprovalRequired as asked:
            ids.append(asked.approval_id)
    return list(ApprovalRequest.objects.filter(pk__in=ids).order_by("expires_at", "id"))


# --- policies -------------------------------------------------------------------------------


def set_policy(tenant, *, reason: str = "set up by a test", changed_by: str = "admin", **document) -> dict:
    """A new version of the tenant's policy with ``document``'s fields (validate_policy fills the rest)."""
    return policy_change(tenant=tenant, document=document, changed_by=changed_by, reason=reason).document


def set_cost_policy(
    tenant,
    *,
    run=None,
    tenant_limit=None,
    retry=None,
    provider=None,
    window_s=None,
    ttl_s=None,
    breaker=None,
) -> dict:
    """Change only the cost fields of the tenant's policy: the limits in cents of a run, the
    tenant, an operation's retries and each provider, the window, the reservations' time to
    live, and the breaker's thresholds (given ones over the defaults)."""
    document: dict = {
        "cost_limits_cents": {"run": run, "tenant": tenant_limit, "retry": retry, "provider": provider or {}}
    }
    if window_s is not None:
        document["cost_window_s"] = window_s
    if ttl_s is not None:
        document["reservation_ttl_s"] = ttl_s
    if breaker is not None:
        defaults = {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0, "throttled_max_dispatched": 2}
        document["breaker"] = {**defaults, **breaker}
    return set_policy(tenant, reason="cost limits for a test", changed_by="test", **document)


# --- credentials ----------------------------------------------------------------------------

SECRET_REF = "vault:kv/github-bot"
GITHUB_PAT = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2  # what a secret looks like: never stored, never echoed


def credential(tenant, principal: str = "github-bot") -> Credential:
    """The tenant's credential of ``principal`` (created at version 1 when missing)."""
    found = Credential.objects.filter(tenant=tenant, principal=principal).first()
    return found or credentials.credential_create(tenant=tenant, principal=principal, secret_ref=SECRET_REF)


def credential_lease(
    identity, run, token, principal="github-bot", actions=None, resources=None, ttl_s=60
) -> CredentialLease:
    """A lease of ``principal``'s credential issued to ``run`` under ``token``."""
    return credential_leases.credential_lease_issue(
        worker=identity.worker,
        run_id=run.pk,
        fencing_token=token,
        principal=principal,
        actions=["read"] if actions is None else actions,
        resources=["repo:acme/widgets"] if resources is None else resources,
        ttl_s=ttl_s,
    )


def active_leases(identity, count: int, *, principal: str = "github-bot", runs: int = 1) -> list[CredentialLease]:
    """``count`` active leases of ``principal`` spread over ``runs`` leased runs."""
    credential(identity.tenant, principal)
    holders = [leased_run(identity.worker, owner=f"holder-{i}", ttl_s=600) for i in range(runs)]
    issued = []
    for i in range(count):
        run, token = holders[i % runs]
        issued.append(credential_lease(identity, run, token, principal, ttl_s=600))
    return issued


# --- resources and endpoints ------------------------------------------------------------------


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


def webhook_endpoint(
    tenant, target: str = "https://hooks.example.com/in", kinds=("quarantine",), name: str = "ops", **fields
):
    """An endpoint an admin (alice) made to page the on-call: the endpoint and its signing secret."""
    return endpoint_create(
        tenant=tenant,
        name=name,
        target=target,
        kinds=list(kinds),
        reason="page the on-call",
        created_by="alice",
        **fields,
    )


# --- schema upgrades ---------------------------------------------------------------------


def state_conflict(identity, key="c-1") -> StateConflict:
    """An operation whose string and structured provider records disagree (as a rolling
    deploy's old build can leave it), found by a reader: an open conflict on its run."""
    run, token = leased_run(identity.worker)
    op = dispatched_operation(identity.worker, run, token, key)
    Operation.objects.filter(pk=op.pk).update(
        provider_request_id="ch_2", provider_ref={"provider": op.provider, "id": "ch_1"}
    )
    conflict = conflict_open(operation_id=op.pk, found_by="test")
    assert conflict is not None
    return conflict
