"""The other tenants: Globex, which the demo users never see, and Initech, whose cost
breaker is DEGRADED (900 of its 1,000 cents reserved): its policy's levers hand a PURE call
dispatched there an output ceiling and a cheaper model, which the worker reports it used, and a
call that is not PURE is denied (the tenant page's report shows both)."""

import contextlib

from ledger.errors import Denied
from ledger.models import Worker
from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, operations, outcomes, runs
from ledger.services.fleet.workers import worker_create
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.tenants import tenant_ensure
from ledger.states import EffectClass, Outcome

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
        document={
            "cost_limits_cents": {"run": None, "tenant": 1000, "retry": None, "provider": {}},
            "breaker": {**BREAKER, "levers": LEVERS},
            "retry_budget": {"automatic_attempts": 2, "max_attempts": 4, "max_cost_cents": 300},
        },
        changed_by="admin",
        reason="a small spend cap; cheaper models and shorter answers while it runs low",
    )
    for username, role in USERS:  # the demo users work on initech too, in the same roles
        role_grant(username=username, tenant=tenant, role=role)
    spender, _ = worker_create(tenant=tenant, name="initech-worker")
    run, _ = runs.run_create(worker=spender, schema_version=1, external_id="initech-spend")
    token = leases.lease_acquire(worker=spender, run_id=run.pk, owner_id="i-agent", ttl_s=3600).fencing_token
    call(spender, run.pk, token, "i:1", 900, provider="openai")  # 90%: DEGRADED, left in flight
    # A PURE call under DEGRADED: handed the levers, it takes the cheaper model and says so.
    cheap = call(spender, run.pk, token, "i:2", 20, provider="openai")
    outcomes.operation_report_outcome(
        worker=spender,
        operation_id=cheap.operation.pk,
        fencing_token=token,
        outcome=Outcome.CONFIRMED,
        actual_cost_cents=4,
        fallback_used=cheap.levers is not None and bool(cheap.levers.fallbacks),
    )
    with contextlib.suppress(Denied):  # not PURE while DEGRADED: denied (DENY_BUDGET, tenant:breaker)
        call(spender, run.pk, token, "i:3", 50, provider="anthropic", effect_class=EffectClass.IDEMPOTENT)


BREAKER = {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0, "throttled_max_dispatched": 2}
LEVERS = {
    "THROTTLED": {"max_output_tokens": 1024, "fallbacks": ["gpt-4o-mini"]},
    "DEGRADED": {"max_output_tokens": 256, "fallbacks": ["gpt-4o-mini", "local-8b"]},
}


def call(
    worker: Worker,
    run_id: object,
    token: int,
    key: str,
    estimate: int,
    *,
    provider: str,
    effect_class: EffectClass = EffectClass.PURE,
) -> operations.Dispatched:
    """A model call intended, authorized and dispatched: what the dispatch handed over."""
    intent = Intent(
        tool="llm",
        action="complete",
        resource="model:large",
        effect_class=effect_class,
        idempotency_key=key,
        estimated_cost_cents=estimate,
        provider=provider,
    )
    op, _ = operations.operation_intend(worker=worker, run_id=run_id, fencing_token=token, intent=intent)
    operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
    return operations.operation_dispatch_terms(worker=worker, operation_id=op.pk, fencing_token=token)
