"""The other tenants: Globex, which the demo users never see, and Initech, whose cost
breaker is DEGRADED (900 of its 1,000 cents reserved)."""

from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, runs
from ledger.services.fleet.workers import worker_create
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.tenants import tenant_ensure
from ledger.states import EffectClass

# The console's users (password: <user>-demo) and their roles on the demo tenant and Initech.
USERS = [("viewer", "viewer"), ("operator", "operator"), ("approver", "approver"), ("admin", "admin")]


def seed() -> None:
    globex()
    initech()


def globex() -> None:
    """Another tenant: the demo users see nothing of it."""
    tenant, _ = tenant_ensure(slug="globex", name="Globex")
    role_grant(username="globex-admin", tenant=tenant, role="admin", password="globex-admin-demo")  # noqa: S106 - the documented demo sign-in
    other, _ = worker_create(tenant=tenant, name="globex-worker")
    run, _ = runs.run_create(worker=other, schema_version=1, external_id="globex-run")
    leases.lease_acquire(worker=other, run_id=run.pk, owner_id="g-agent", ttl_s=3600)


def initech() -> None:
    """A small spend cap, 900 of its 1,000 cents reserved by one dispatched call."""
    tenant, _ = tenant_ensure(slug="initech", name="Initech")
    policy_change(
        tenant=tenant,
        document={"cost_limits_cents": {"run": None, "tenant": 1000, "retry": None, "provider": {}}},
        changed_by="admin",
        reason="a small spend cap",
    )
    for username, role in USERS:  # the demo users work on initech too, in the same roles
        role_grant(username=username, tenant=tenant, role=role)
    spender, _ = worker_create(tenant=tenant, name="initech-worker")
    run, _ = runs.run_create(worker=spender, schema_version=1, external_id="initech-spend")
    token = leases.lease_acquire(worker=spender, run_id=run.pk, owner_id="i-agent", ttl_s=3600).fencing_token
    intent = Intent(
        tool="llm",
        action="complete",
        resource="model:large",
        effect_class=EffectClass.PURE,
        idempotency_key="i:1",
        estimated_cost_cents=900,
    )
    op, _ = operations.operation_intend(worker=spender, run_id=run.pk, fencing_token=token, intent=intent)
    operations.operation_authorize(worker=spender, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=spender, operation_id=op.pk, fencing_token=token)
