"""The tenant cost breaker's states (ledger/services/authority/breaker.py): NORMAL,
THROTTLED, DEGRADED and OPEN follow reserved plus settled spend; OPEN outranks UNKNOWN and
UNKNOWN outranks spend; what each state lets through; a state from an ended window is not
obeyed. Failure injection for the breaker is tests/faults/test_cost_breaker.py."""

from datetime import timedelta

from django.utils import timezone

from ledger.models import Operation, Tenant
from ledger.states import BreakerState
from tests.factories import confirm, dispatched_operation, leased_run, planned_op, set_cost_policy
from tests.helpers import assert_chain_intact, events_of
from tests.ledger.authority.costs import (
    allows,
    breaker,
    mark_unknown,
    reserve,
    resolve,
    settle,
)

# --- the breaker ------------------------------------------------------------------------------


def test_the_breaker_follows_reserved_plus_settled_spend_through_its_thresholds(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    seen = []
    for i, estimate in enumerate((500, 100, 250, 150)):  # 50%, 60%, 85%, 100%
        reserve(acme.tenant, planned_op(acme, run, token, f"k{i}", estimate=estimate))
        seen.append(breaker(acme.tenant))
    assert seen == ["NORMAL", "THROTTLED", "DEGRADED", "OPEN"]
    changes = [(e.fields["from"], e.fields["to"]) for e in events_of(run, "BREAKER_CHANGED")]
    assert changes == [("NORMAL", "THROTTLED"), ("THROTTLED", "DEGRADED"), ("DEGRADED", "OPEN")]
    assert "1000 of 1000 cents" in events_of(run, "BREAKER_CHANGED")[-1].fields["reason"]
    tenant = Tenant.objects.get(pk=acme.tenant.pk)
    assert tenant.breaker_changed_at is not None and "100%" in tenant.breaker_reason

    settle(acme.tenant, Operation.objects.get(idempotency_key="k3"), 0)  # 850 of 1000
    assert breaker(acme.tenant) == BreakerState.DEGRADED
    assert_chain_intact(run.pk)


def test_open_outranks_unknown_and_unknown_outranks_spend(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    lost = planned_op(acme, run, token, "lost", estimate=700)
    reserve(acme.tenant, lost)
    assert breaker(acme.tenant) == BreakerState.THROTTLED
    mark_unknown(acme.tenant, [lost])
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    reserve(acme.tenant, planned_op(acme, run, token, "last", estimate=300))
    assert breaker(acme.tenant) == BreakerState.OPEN


def test_without_a_tenant_limit_the_breaker_only_knows_unknown(acme):
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=10_000)
    reserve(acme.tenant, op)
    assert breaker(acme.tenant) == BreakerState.NORMAL
    settle(acme.tenant, op, None)
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    resolve(acme.tenant, op, 9000)
    assert breaker(acme.tenant) == BreakerState.NORMAL


def test_a_zero_tenant_limit_is_open(acme):
    set_cost_policy(acme.tenant, tenant_limit=0)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=0)
    reserve(acme.tenant, op)  # a free operation fits a zero budget
    assert breaker(acme.tenant) == BreakerState.OPEN


def test_breaker_open_refuses_new_work(acme):
    set_cost_policy(acme.tenant, tenant_limit=100)
    run, token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, run, token, "k1", estimate=100))
    pure = planned_op(acme, run, token, "k2", estimate=0, effect_class="PURE")
    refusal = allows(acme.tenant, pure)
    assert refusal.code == "DENY_BUDGET" and refusal.extra["budget"] == "tenant:breaker"
    assert "OPEN" in refusal.detail


def test_breaker_degraded_lets_only_pure_operations_through(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, run, token, "k1", estimate=900))
    assert breaker(acme.tenant) == BreakerState.DEGRADED
    assert allows(acme.tenant, planned_op(acme, run, token, "pure", estimate=10, effect_class="PURE")) is None
    refusal = allows(acme.tenant, planned_op(acme, run, token, "write", estimate=10, effect_class="IDEMPOTENT"))
    assert refusal.extra["budget"] == "tenant:breaker" and "only PURE" in refusal.detail


def test_breaker_throttled_counts_the_tenants_operations_in_flight_across_its_runs_only(acme, outsider):
    """THROTTLED caps the operations in flight, counted from the runs' counters (the operations
    table has no index on the phase)."""
    first, first_token = leased_run(acme.worker)
    second, second_token = leased_run(acme.worker, owner="owner-b")
    dispatched_operation(acme.worker, first, first_token, "flight-1")
    landed = dispatched_operation(acme.worker, second, second_token, "flight-2")
    theirs, their_token = leased_run(outsider.worker)
    for n in range(3):  # another tenant's operations in flight are not this tenant's
        dispatched_operation(outsider.worker, theirs, their_token, f"theirs-{n}")
    set_cost_policy(acme.tenant, tenant_limit=1000, breaker={"throttled_max_dispatched": 3})
    reserve(acme.tenant, planned_op(acme, first, first_token, "k1", estimate=700))
    assert breaker(acme.tenant) == BreakerState.THROTTLED
    candidate = planned_op(acme, first, first_token, "next", estimate=10)
    assert allows(acme.tenant, candidate) is None  # 2 in flight, 3 allowed

    set_cost_policy(acme.tenant, tenant_limit=1000, breaker={"throttled_max_dispatched": 2})
    refusal = allows(acme.tenant, candidate)  # 2 in flight, 2 allowed
    assert refusal.extra["budget"] == "tenant:breaker" and "THROTTLED" in refusal.detail
    confirm(acme.worker, landed, second_token)
    assert allows(acme.tenant, candidate) is None  # 1 in flight


def test_breaker_unknown_refuses_retries_until_reconciled(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    lost = planned_op(acme, run, token, "lost", estimate=100)
    reserve(acme.tenant, lost)
    mark_unknown(acme.tenant, [lost])
    retry = planned_op(acme, run, token, "retrying", estimate=100)
    refusal = allows(acme.tenant, retry, retry=True)
    assert refusal.extra["budget"] == "tenant:breaker" and "UNKNOWN" in refusal.detail
    assert allows(acme.tenant, retry, retry=False) is None  # new work at 10% spend goes on
    resolve(acme.tenant, lost, 80)
    assert allows(acme.tenant, retry, retry=True) is None


def test_a_breaker_state_from_an_ended_window_is_not_obeyed(acme):
    set_cost_policy(acme.tenant, tenant_limit=100)
    run, token = leased_run(acme.worker)
    two_days_ago = timezone.now() - timedelta(days=2)
    reserve(acme.tenant, planned_op(acme, run, token, "k1", estimate=100), now=two_days_ago)
    settle(acme.tenant, Operation.objects.get(idempotency_key="k1"), 100, now=two_days_ago)
    assert breaker(acme.tenant) == BreakerState.OPEN  # stored when that window was full
    assert allows(acme.tenant, planned_op(acme, run, token, "today", estimate=50)) is None
    reserve(acme.tenant, Operation.objects.get(idempotency_key="today"))
    assert breaker(acme.tenant) == BreakerState.NORMAL  # the next evaluation stores it
