"""Builders for the decision-queue tests: reconciliation cases and approval requests made
through the real services (no fake rows), users with a role, and CSRF-enforcing clients."""

from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest, ReconciliationCase
from ledger.errors import ApprovalRequired
from ledger.models import Event, Operation, Run
from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, outcomes
from ledger.services.tenancy.roles import role_grant
from tests.ledger.factories import dispatched_operation, leased_run

ROLES = ("viewer", "operator", "approver", "admin")


def unknown_cases(worker, count: int, *, prefix: str = "case") -> list[ReconciliationCase]:
    """``count`` operations dispatched in one run whose lease is then released: each outcome
    is UNKNOWN and opens a case (one service call per step, as a worker would)."""
    run, token = leased_run(worker)
    for i in range(count):
        dispatched_operation(worker, run, token, f"{prefix}-{i}")
    leases.lease_release(worker=worker, run_id=run.pk, owner_id="owner-a", fencing_token=token)
    return list(ReconciliationCase.objects.filter(run=run).order_by("opened_at", "id"))


def unknown_case(worker, key: str = "timeout-1") -> ReconciliationCase:
    """One effect the worker reported as UNKNOWN (the provider timed out)."""
    run, token = leased_run(worker)
    op = dispatched_operation(worker, run, token, key)
    outcomes.operation_report_outcome(
        worker=worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN", error_code="READ_TIMEOUT"
    )
    return ReconciliationCase.objects.get(operation=op)


def pending_approvals(worker, count: int = 1, *, prefix: str = "charge") -> list[ApprovalRequest]:
    """``count`` payments the tenant's policy puts before a person, each waiting on a request."""
    policy_change(
        tenant=worker.tenant,
        document={"human_approval_tools": ["payments"]},
        changed_by="admin",
        reason="every payment is approved by a person",
    )
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


def user_with(role: str | None, tenant, name: str | None = None):
    from django.contrib.auth import get_user_model

    name = name or f"q-{role or 'none'}-{tenant.slug}"
    if role is None:
        return get_user_model().objects.create_user(username=name)
    user, _ = role_grant(username=name, tenant=tenant, role=role)
    return user


class Browser:
    """A signed-in person with a real session and a CSRF token, as a browser would have."""

    def __init__(self, user):
        self.user = user
        self.client = Client(enforce_csrf_checks=True)
        self.client.force_login(user)
        page = self.client.get(reverse("home"))
        assert page.status_code == 200
        self.csrf = self.client.cookies["csrftoken"].value

    def get(self, url, data=None, **kwargs):
        return self.client.get(url, data, **kwargs)

    def post(self, url, data=None, **kwargs):
        return self.client.post(url, {**(data or {}), "csrfmiddlewaretoken": self.csrf}, **kwargs)


def snapshot() -> dict:
    """Every row a console action could change."""
    from guardian.models import UserObjectPermission

    from ledger.models import AdminAction, Credential, CredentialLease, RunLease, TenantPolicy, Worker

    return {
        "cases": list(ReconciliationCase.objects.order_by("id").values()),
        "approvals": list(ApprovalRequest.objects.order_by("id").values()),
        "operations": list(
            Operation.objects.order_by("id").values("id", "phase", "reconciliation", "provider_request_id")
        ),
        "runs": list(Run.objects.order_by("id").values("id", "last_seq", "last_hash")),
        "leases": list(CredentialLease.objects.order_by("id").values()),
        "credentials": list(Credential.objects.order_by("id").values()),
        "workers": list(Worker.objects.order_by("id").values()),
        "run_leases": list(RunLease.objects.order_by("run_id").values()),
        "policies": TenantPolicy.objects.count(),
        "admin_actions": AdminAction.objects.count(),
        "perms": sorted(UserObjectPermission.objects.values_list("user_id", "object_pk", "permission_id")),
        "events": Event.objects.count(),
    }
