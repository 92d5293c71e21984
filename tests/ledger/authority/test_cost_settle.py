"""Settling a reservation: the unused estimate released in the same statement, a repeated
outcome settled once, missing usage kept as UNKNOWN, an overage recorded within the limit
(it opens the breaker); UNKNOWN reservations moved in one go and closed by reconciliation."""

from ledger.errors import Denied
from ledger.models import CostReservation, Tenant
from ledger.services.authority.breaker import OVERAGE_REASON
from ledger.states import BreakerState, BudgetKind, ReservationState
from tests.factories import leased_run, planned_op, set_cost_policy
from tests.helpers import assert_chain_intact, events_of
from tests.ledger.authority.costs import (
    allows,
    assert_ledger_reconciles,
    breaker,
    mark_unknown,
    reserve,
    resolve,
    settle,
    window,
)

# --- settling -----------------------------------------------------------------------------


def test_settling_releases_the_unused_estimate_in_the_same_statement(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, provider={"llm": 1000})
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300, provider="llm")
    reserve(acme.tenant, op)

    settle(acme.tenant, op, 120)

    reservation = CostReservation.objects.get(operation=op)
    assert (reservation.state, reservation.actual_cents) == (ReservationState.SETTLED, 120)
    assert reservation.closed_at is not None
    for kind, key in ((BudgetKind.TENANT, "acme"), (BudgetKind.PROVIDER, "llm")):
        w = window(acme.tenant, kind, key)
        assert (w.reserved_cents, w.settled_cents) == (0, 120)
    [event] = events_of(run, "COST_SETTLED")
    assert event.fields["released_cents"] == 180 and event.fields["actual_cents"] == 120
    assert "overage_cents" not in event.fields
    assert_ledger_reconciles(acme.tenant)


def test_settling_zero_releases_the_reservation(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 0)
    assert CostReservation.objects.get(operation=op).state == ReservationState.RELEASED
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (w.reserved_cents, w.settled_cents) == (0, 0)
    assert len(events_of(run, "COST_RELEASED")) == 1


def test_a_repeated_outcome_settles_once(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 100)
    settle(acme.tenant, op, 100)
    settle(acme.tenant, op, None)
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (w.reserved_cents, w.settled_cents) == (0, 100)
    assert len(events_of(run, "COST_SETTLED")) == 1
    assert CostReservation.objects.get(operation=op).state == ReservationState.SETTLED


def test_missing_usage_keeps_the_estimate_counted_as_unknown(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300)
    reserve(acme.tenant, op)

    settle(acme.tenant, op, None)

    assert CostReservation.objects.get(operation=op).state == ReservationState.UNKNOWN
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 300
    [event] = events_of(run, "COST_UNKNOWN")
    assert event.fields["reason"] == "usage missing"
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    assert_ledger_reconciles(acme.tenant)


def test_an_overage_is_settled_within_the_limit_recorded_and_opens_the_breaker(acme):
    set_cost_policy(acme.tenant, run=10_000, tenant_limit=10_000, provider={"llm": 1000})
    run, token = leased_run(acme.worker)
    first = planned_op(acme, run, token, "k1", estimate=300, provider="llm")
    other = planned_op(acme, run, token, "k2", estimate=600, provider="llm")
    reserve(acme.tenant, first)
    reserve(acme.tenant, other)

    settle(acme.tenant, first, 550)  # the provider billed 550 for a worst case of 300

    reservation = CostReservation.objects.get(operation=first)
    assert (reservation.state, reservation.actual_cents) == (ReservationState.SETTLED, 550)  # attributable in full
    provider = window(acme.tenant, BudgetKind.PROVIDER, "llm")
    assert (provider.reserved_cents, provider.settled_cents) == (600, 400)  # full: 150 did not fit
    tenant_window = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (tenant_window.reserved_cents, tenant_window.settled_cents) == (600, 550)  # fits whole
    [event] = events_of(run, "COST_SETTLED")
    assert event.fields["overage_cents"] == 150
    assert event.fields["overage_keys"] == ["provider:llm"]
    assert breaker(acme.tenant) == BreakerState.OPEN
    assert Tenant.objects.get(pk=acme.tenant.pk).breaker_reason.startswith(OVERAGE_REASON)
    changed = events_of(run, "BREAKER_CHANGED")[-1]
    assert (changed.fields["from"], changed.fields["to"]) == ("NORMAL", "OPEN")
    assert isinstance(allows(acme.tenant, other), Denied)

    # The OPEN holds for the rest of the window, whatever the spend does meanwhile.
    settle(acme.tenant, other, 0)
    assert breaker(acme.tenant) == BreakerState.OPEN
    assert_ledger_reconciles(acme.tenant)
    assert_chain_intact(run.pk)


def test_an_overage_on_the_tenant_window_leaves_it_exactly_full(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=700)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 1500)
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (w.reserved_cents, w.settled_cents) == (0, 1000)
    assert events_of(run, "COST_SETTLED")[0].fields["overage_cents"] == 500
    assert breaker(acme.tenant) == BreakerState.OPEN


# --- UNKNOWN and reconciliation -------------------------------------------------------------


def test_mark_unknown_moves_the_reserved_current_attempts_in_one_go(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    a = planned_op(acme, run, token, "a", estimate=100)
    b = planned_op(acme, run, token, "b", estimate=100)
    settled = planned_op(acme, run, token, "c", estimate=100)
    free = planned_op(acme, run, token, "d")
    for op in (a, b, settled):
        reserve(acme.tenant, op)
    settle(acme.tenant, settled, 50)

    moved = mark_unknown(acme.tenant, [a, b, settled, free], reason="lease_lost")

    assert moved == 2
    unknown_ops = CostReservation.objects.filter(state=ReservationState.UNKNOWN).values_list("operation_id", flat=True)
    assert set(unknown_ops) == {a.pk, b.pk}
    unknown = events_of(run, "COST_UNKNOWN")
    assert [e.fields["reason"] for e in unknown] == ["lease_lost", "lease_lost"]
    assert mark_unknown(acme.tenant, [a, b]) == 0  # already UNKNOWN: nothing twice
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 200
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    assert len(events_of(run, "BREAKER_CHANGED")) == 1
    assert_ledger_reconciles(acme.tenant)


def test_reconciliation_settles_releases_or_charges_the_worst_case(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    happened = planned_op(acme, run, token, "a", estimate=300)
    not_happened = planned_op(acme, run, token, "b", estimate=300)
    usage_lost = planned_op(acme, run, token, "c", estimate=300)
    for op in (happened, not_happened, usage_lost):
        reserve(acme.tenant, op)
    mark_unknown(acme.tenant, [happened, not_happened, usage_lost])

    resolve(acme.tenant, happened, 210)
    resolve(acme.tenant, not_happened, 0)
    assert breaker(acme.tenant) == BreakerState.UNKNOWN  # one is still UNKNOWN
    resolve(acme.tenant, usage_lost, None)

    states = dict(CostReservation.objects.values_list("operation_id", "state"))
    assert states == {happened.pk: "SETTLED", not_happened.pk: "RELEASED", usage_lost.pk: "SETTLED"}
    assert CostReservation.objects.get(operation=usage_lost).actual_cents == 300
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (w.reserved_cents, w.settled_cents) == (0, 510)
    assert breaker(acme.tenant) == BreakerState.NORMAL
    assert [e.fields["via"] for e in events_of(run, "COST_SETTLED")] == ["reconciliation", "reconciliation"]
    assert resolve(acme.tenant, happened, 999).state == ReservationState.SETTLED  # closed stays closed
    assert window(acme.tenant, BudgetKind.TENANT, "acme").settled_cents == 510
