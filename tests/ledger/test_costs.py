"""Cost budgets and the tenant cost breaker (ledger.services.costs), service by service.

Fixtures go through the real services: tenants and workers (tests.conftest), limits through
``policy_change``, runs, leases and operations through their services. The cost services
are called as authorize / dispatch / outcome will call them: inside the caller's
transaction, with the run and its lease locked, events gathered in a ChainBatch that the
caller commits.
"""

from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.actors import SYSTEM_RESERVATION_EXPIRY
from ledger.errors import Denied, InvalidInput
from ledger.models import CostReservation, CostWindow, Event, Operation, Tenant
from ledger.services.authority import reservations, windows
from ledger.services.authority.breaker import OVERAGE_REASON, breaker_allows
from ledger.services.authority.policy import policy_change, policy_current
from ledger.services.core.fencing import lock_run
from ledger.services.core.intent import Intent
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence import operations
from ledger.services.fence.operations import operation_intend
from ledger.states import BreakerState, BudgetKind, ReservationState
from tests.factories import confirm, dispatched_operation, leased_run
from tests.helpers import assert_chain_intact, runs_held_elsewhere

ACTOR = "worker:worker-1/owner-a"


# --- helpers shared with tests/faults/test_cost_breaker.py -------------------------------


def set_policy(
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
    """Change only the cost fields of the tenant's policy (validate_policy fills the rest)."""
    document = {"cost_limits_cents": {"run": run, "tenant": tenant_limit, "retry": retry, "provider": provider or {}}}
    if window_s is not None:
        document["cost_window_s"] = window_s
    if ttl_s is not None:
        document["reservation_ttl_s"] = ttl_s
    if breaker is not None:
        defaults = {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0, "throttled_max_dispatched": 2}
        document["breaker"] = {**defaults, **breaker}
    return policy_change(tenant=tenant, document=document, changed_by="test", reason="cost limits for a test").document


def planned_op(identity, run, token, key, *, estimate=None, provider="", effect_class="IDEMPOTENT") -> Operation:
    op, _ = operation_intend(
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


def new_attempt(op: Operation, attempt: int) -> Operation:
    """Stand-in for operation_retry (written concurrently): the operation's next attempt."""
    Operation.objects.filter(pk=op.pk).update(attempt=attempt)
    return Operation.objects.get(pk=op.pk)


@contextmanager
def under_lock(tenant, run_id, now=None):
    """What a fenced caller has: the run and its lease locked, a batch committed at the end."""
    with transaction.atomic():
        run = lock_run(tenant=tenant, run_id=run_id)
        batch = ChainBatch(now or timezone.now())
        yield run, batch
        batch.commit()


def reserve(tenant, op, *, now=None):
    with under_lock(tenant, op.run_id, now) as (run, batch):
        _, policy = policy_current(tenant=tenant)
        op = Operation.objects.get(pk=op.pk)
        return reservations.cost_reserve(op=op, run=run, policy=policy, batch=batch, actor=ACTOR, now=batch.now)


def settle(tenant, op, actual, *, now=None):
    with under_lock(tenant, op.run_id, now) as (run, batch):
        op = Operation.objects.get(pk=op.pk)
        reservations.cost_settle(op=op, run=run, actual_cents=actual, batch=batch, actor=ACTOR, now=batch.now)


def resolve(tenant, op, actual, *, now=None):
    with under_lock(tenant, op.run_id, now) as (run, batch):
        op = Operation.objects.get(pk=op.pk)
        return reservations.cost_resolve(
            op=op, run=run, actual_cents=actual, batch=batch, actor="user:olga", now=batch.now
        )


def mark_unknown(tenant, ops, reason="provider timeout"):
    with under_lock(tenant, ops[0].run_id) as (run, batch):
        ops = [Operation.objects.get(pk=op.pk) for op in ops]
        return reservations.cost_mark_unknown(
            ops=ops, runs={run.pk: run}, batch=batch, actor=ACTOR, now=batch.now, reason=reason
        )


def allows(tenant, op, *, retry=False):
    _, policy = policy_current(tenant=tenant)
    op = Operation.objects.get(pk=op.pk)
    return breaker_allows(tenant=tenant, op=op, policy=policy, attempt_is_retry=retry)


def window(tenant, kind, key, *, now=None, window_s=86400) -> CostWindow:
    starts_at, _ = windows.window_bounds(now or timezone.now(), window_s)
    return CostWindow.objects.get(tenant=tenant, kind=kind, key=key, starts_at=starts_at)


def breaker(tenant) -> str:
    return Tenant.objects.get(pk=tenant.pk).breaker_state


def assert_ledger_reconciles(tenant) -> None:
    """The article's invariant: each window's reserved cents are exactly the estimates of
    its open reservations, and no window holds more than its limit."""
    for w in CostWindow.objects.filter(tenant=tenant):
        assert reservations.window_reconciles(w), f"{w.kind}:{w.key} does not reconcile"
        assert w.reserved_cents + w.settled_cents <= w.limit_cents


def events_of(run, type_):
    return list(Event.objects.filter(run=run, type=type_).order_by("seq"))


# --- windows and keys ---------------------------------------------------------------------


def test_windows_are_aligned_to_the_epoch():
    now = datetime(2026, 8, 14, 2, 4, 55, 123456, tzinfo=UTC)
    assert windows.window_bounds(now, 86400) == (datetime(2026, 8, 14, tzinfo=UTC), datetime(2026, 8, 15, tzinfo=UTC))
    assert windows.window_bounds(now, 3600)[0] == datetime(2026, 8, 14, 2, tzinfo=UTC)
    boundary = datetime(2026, 8, 14, 3, tzinfo=UTC)
    assert windows.window_bounds(boundary, 3600)[0] == boundary
    assert windows.window_bounds(boundary - timedelta(microseconds=1), 3600)[0] == datetime(2026, 8, 14, 2, tzinfo=UTC)


def test_no_estimate_and_no_limit_reserves_nothing(acme):
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1")
    assert reserve(acme.tenant, op) is None
    assert not CostReservation.objects.exists()
    assert not events_of(run, "COST_RESERVED")


def test_a_missing_estimate_is_refused_where_a_limit_applies(acme):
    set_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1")
    with pytest.raises(Denied) as refused:
        reserve(acme.tenant, op)
    assert refused.value.code == "DENY_BUDGET"
    assert refused.value.extra["budget"] == "estimate"
    assert "worst-case" in refused.value.detail


def test_a_limit_on_another_provider_does_not_need_an_estimate(acme):
    set_policy(acme.tenant, provider={"premium-llm": 1000})
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", provider="cheap-llm")
    assert reserve(acme.tenant, op) is None


def test_an_estimate_without_limits_is_still_recorded_for_attribution(acme):
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=40, provider="cheap-llm")
    reservation = reserve(acme.tenant, op)
    assert reservation.state == ReservationState.RESERVED
    assert reservation.windows.count() == 0
    assert events_of(run, "COST_RESERVED")[0].fields["keys"] == []


def test_a_reservation_charges_every_applicable_key_once(acme):
    set_policy(acme.tenant, run=500, tenant_limit=1000, retry=200, provider={"premium-llm": 800, "other": 5})
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300, provider="premium-llm")
    now = timezone.now()

    reservation = reserve(acme.tenant, op, now=now)

    keys = {(w.kind, w.key): (w.limit_cents, w.reserved_cents) for w in reservation.windows.all()}
    assert keys == {
        (BudgetKind.RUN, str(run.pk)): (500, 300),
        (BudgetKind.TENANT, "acme"): (1000, 300),
        (BudgetKind.PROVIDER, "premium-llm"): (800, 300),
    }  # no RETRY window on the first attempt, no window for the other provider
    assert reservation.attempt == 1 and reservation.estimated_cents == 300 and reservation.provider == "premium-llm"
    assert reservation.expires_at == now + timedelta(seconds=900)
    [event] = events_of(run, "COST_RESERVED")
    assert event.fields == {
        "reservation_id": str(reservation.pk),
        "operation_id": str(op.pk),
        "attempt": 1,
        "estimated_cents": 300,
        "keys": [f"run:{run.pk}", "tenant:acme", "provider:premium-llm"],
    }
    assert_ledger_reconciles(acme.tenant)
    assert_chain_intact(run.pk)


def _dispatch_first_operation(identity, key: str):
    """A new run, leased, and its first operation dispatched (estimate 100) through the services."""
    run, token = leased_run(identity.worker)
    op = planned_op(identity, run, token, key, estimate=100)
    operations.operation_authorize(worker=identity.worker, operation_id=op.pk, fencing_token=token)
    op = operations.operation_dispatch(worker=identity.worker, operation_id=op.pk, fencing_token=token)
    assert op.phase == "DISPATCHED"
    window = CostWindow.objects.get(tenant=identity.tenant, kind=BudgetKind.RUN, key=str(run.pk))
    assert window.reserved_cents == 100
    return run


def test_the_first_dispatch_of_a_run_is_charged_in_one_statement(acme, monkeypatch):
    """A run's first dispatch of a period finds no RUN window: the process opens it before
    the one-statement charge, instead of failing that statement and charging key by key
    (issue 16: one dispatch in 20 of the benchmark took that path, at ten times the cost)."""
    set_policy(acme.tenant, run=500)
    key_by_key = []
    by_one = reservations._reserve_one_by_one
    monkeypatch.setattr(
        reservations, "_reserve_one_by_one", lambda **kw: key_by_key.append(kw["op"].pk) or by_one(**kw)
    )
    runs = [_dispatch_first_operation(acme, f"first-{n}") for n in range(3)]
    assert key_by_key == []
    for run in runs:
        assert_chain_intact(run.pk)
    assert_ledger_reconciles(acme.tenant)


def test_a_window_the_process_believes_open_but_is_not_is_opened_key_by_key(acme, monkeypatch):
    """The process's note of open windows is a hint: a window it names that is not there
    (the transaction that opened it rolled back) fails the one-statement charge, and the
    key-by-key path opens it and charges it."""
    set_policy(acme.tenant, run=500)
    key_by_key = []
    by_one = reservations._reserve_one_by_one
    monkeypatch.setattr(
        reservations, "_reserve_one_by_one", lambda **kw: key_by_key.append(kw["op"].pk) or by_one(**kw)
    )
    real_ensure = reservations._windows_in_place
    monkeypatch.setattr(reservations, "_windows_in_place", lambda **kw: None)  # as if every window were noted open
    run = _dispatch_first_operation(acme, "believed-open")
    assert len(key_by_key) == 1  # the statement found no RUN window; the key-by-key path opened it
    monkeypatch.setattr(reservations, "_windows_in_place", real_ensure)
    assert_chain_intact(run.pk)
    assert_ledger_reconciles(acme.tenant)


def test_a_retry_is_charged_to_the_retry_budget_of_its_operation(acme):
    set_policy(acme.tenant, tenant_limit=1000, retry=250)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=200)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 0)

    second = reserve(acme.tenant, new_attempt(op, 2))
    keys = {(w.kind, w.key) for w in second.windows.all()}
    assert keys == {(BudgetKind.TENANT, "acme"), (BudgetKind.RETRY, str(op.pk))}
    settle(acme.tenant, op, 200)
    with pytest.raises(Denied) as refused:
        reserve(acme.tenant, new_attempt(op, 3))  # 200 + 200 > 250: the retries of this operation are spent
    assert refused.value.extra["budget"] == "retry:cents"
    assert refused.value.detail == "retry budget of this operation has 50 of 250 cents left; this needs 200"


def test_a_refusing_key_takes_back_every_other_key(acme):
    set_policy(acme.tenant, run=5000, tenant_limit=5000, provider={"premium-llm": 1000})
    run, token = leased_run(acme.worker)
    spent = planned_op(acme, run, token, "spent", estimate=880, provider="premium-llm")
    reserve(acme.tenant, spent)
    op = planned_op(acme, run, token, "k2", estimate=300, provider="premium-llm")

    with pytest.raises(Denied) as refused:
        reserve(acme.tenant, op)

    assert refused.value.code == "DENY_BUDGET"
    assert refused.value.extra["budget"] == "provider:cents"
    assert refused.value.detail == "provider budget for 'premium-llm' has 120 of 1000 cents left; this needs 300"
    # Never shrunk to what is left, and nothing of it stays on the keys that had room.
    assert window(acme.tenant, BudgetKind.PROVIDER, "premium-llm").reserved_cents == 880
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 880
    assert window(acme.tenant, BudgetKind.RUN, str(run.pk)).reserved_cents == 880
    assert not CostReservation.objects.filter(operation=op).exists()
    assert len(events_of(run, "COST_RESERVED")) == 1


def test_a_refusal_inside_a_callers_transaction_leaves_the_caller_free_to_go_on(acme):
    """Dispatch catches the refusal and records a DENIED in the same transaction."""
    set_policy(acme.tenant, tenant_limit=100)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300)
    with under_lock(acme.tenant, run.pk) as (locked, batch):
        _, policy = policy_current(tenant=acme.tenant)
        with pytest.raises(Denied):
            reservations.cost_reserve(op=op, run=locked, policy=policy, batch=batch, actor=ACTOR, now=batch.now)
        batch.append(locked, "NOTE", actor=ACTOR, fields={"text": "denied, recorded by the caller"})
    assert [e.type for e in assert_chain_intact(run.pk)][-1] == "NOTE"
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 0


def test_the_same_attempt_reserved_again_gets_the_same_reservation(acme):
    set_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300)
    first = reserve(acme.tenant, op)
    again = reserve(acme.tenant, op)
    assert again.pk == first.pk
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 300
    assert len(events_of(run, "COST_RESERVED")) == 1


def test_the_database_refuses_a_window_over_its_limit(acme):
    """The check constraint behind invariant 7, whatever code tries it."""
    set_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, run, token, "k1", estimate=900))
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    with pytest.raises(IntegrityError), transaction.atomic():
        CostWindow.objects.filter(pk=w.pk).update(settled_cents=200)
    with pytest.raises(IntegrityError), transaction.atomic():
        CostReservation.objects.create(
            tenant=acme.tenant,
            run=run,
            operation=Operation.objects.get(idempotency_key="k1"),
            attempt=1,
            estimated_cents=1,
            created_at=timezone.now(),
            expires_at=timezone.now(),
        )


def test_negative_amounts_are_refused(acme):
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=10)
    reserve(acme.tenant, op)
    with pytest.raises(InvalidInput):
        settle(acme.tenant, op, -1)


# --- settling -----------------------------------------------------------------------------


def test_settling_releases_the_unused_estimate_in_the_same_statement(acme):
    set_policy(acme.tenant, tenant_limit=1000, provider={"llm": 1000})
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
    set_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 0)
    assert CostReservation.objects.get(operation=op).state == ReservationState.RELEASED
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (w.reserved_cents, w.settled_cents) == (0, 0)
    assert len(events_of(run, "COST_RELEASED")) == 1


def test_a_repeated_outcome_settles_once(acme):
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, run=10_000, tenant_limit=10_000, provider={"llm": 1000})
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
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, tenant_limit=1000)
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


# --- the breaker ------------------------------------------------------------------------------


def test_the_breaker_follows_reserved_plus_settled_spend_through_its_thresholds(acme):
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, tenant_limit=0)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=0)
    reserve(acme.tenant, op)  # a free operation fits a zero budget
    assert breaker(acme.tenant) == BreakerState.OPEN


def test_breaker_open_refuses_new_work(acme):
    set_policy(acme.tenant, tenant_limit=100)
    run, token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, run, token, "k1", estimate=100))
    pure = planned_op(acme, run, token, "k2", estimate=0, effect_class="PURE")
    refusal = allows(acme.tenant, pure)
    assert refusal.code == "DENY_BUDGET" and refusal.extra["budget"] == "tenant:breaker"
    assert "OPEN" in refusal.detail


def test_breaker_degraded_lets_only_pure_operations_through(acme):
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, tenant_limit=1000, breaker={"throttled_max_dispatched": 3})
    reserve(acme.tenant, planned_op(acme, first, first_token, "k1", estimate=700))
    assert breaker(acme.tenant) == BreakerState.THROTTLED
    candidate = planned_op(acme, first, first_token, "next", estimate=10)
    assert allows(acme.tenant, candidate) is None  # 2 in flight, 3 allowed

    set_policy(acme.tenant, tenant_limit=1000, breaker={"throttled_max_dispatched": 2})
    refusal = allows(acme.tenant, candidate)  # 2 in flight, 2 allowed
    assert refusal.extra["budget"] == "tenant:breaker" and "THROTTLED" in refusal.detail
    confirm(acme.worker, landed, second_token)
    assert allows(acme.tenant, candidate) is None  # 1 in flight


def test_breaker_unknown_refuses_retries_until_reconciled(acme):
    set_policy(acme.tenant, tenant_limit=1000)
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
    set_policy(acme.tenant, tenant_limit=100)
    run, token = leased_run(acme.worker)
    two_days_ago = timezone.now() - timedelta(days=2)
    reserve(acme.tenant, planned_op(acme, run, token, "k1", estimate=100), now=two_days_ago)
    settle(acme.tenant, Operation.objects.get(idempotency_key="k1"), 100, now=two_days_ago)
    assert breaker(acme.tenant) == BreakerState.OPEN  # stored when that window was full
    assert allows(acme.tenant, planned_op(acme, run, token, "today", estimate=50)) is None
    reserve(acme.tenant, Operation.objects.get(idempotency_key="today"))
    assert breaker(acme.tenant) == BreakerState.NORMAL  # the next evaluation stores it


# --- the reservation timeout job ----------------------------------------------------------------


def test_expired_reservations_become_unknown_once_by_command(acme):
    set_policy(acme.tenant, tenant_limit=1000, ttl_s=60)
    run, token = leased_run(acme.worker)
    stale = [planned_op(acme, run, token, f"stale-{i}", estimate=100) for i in range(3)]
    fresh = planned_op(acme, run, token, "fresh", estimate=100)
    for op in (*stale, fresh):
        reserve(acme.tenant, op)
    CostReservation.objects.filter(operation__in=stale).update(expires_at=timezone.now() - timedelta(seconds=1))

    out, err = StringIO(), StringIO()
    call_command("expire_reservations", "--batch-size", "2", stdout=out, stderr=err)

    assert out.getvalue().strip() == "expired 3 cost reservations; they are now UNKNOWN"
    assert "batch 1: 2 reservations UNKNOWN so far" in err.getvalue()
    assert "batch 2: 3 reservations UNKNOWN so far" in err.getvalue()
    states = dict(CostReservation.objects.values_list("operation_id", "state"))
    assert [states[op.pk] for op in stale] == ["UNKNOWN"] * 3 and states[fresh.pk] == "RESERVED"
    unknown = events_of(run, "COST_UNKNOWN")
    assert len(unknown) == 3
    assert {e.actor for e in unknown} == {SYSTEM_RESERVATION_EXPIRY}
    assert {e.fields["reason"] for e in unknown} == {"reservation expired"}
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    assert reservations.reservations_expire() == 0  # idempotent
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 400
    assert_ledger_reconciles(acme.tenant)
    assert_chain_intact(run.pk)


@pytest.mark.django_db(transaction=True)
def test_the_expiry_job_looks_past_reservations_whose_runs_are_busy_elsewhere(acme):
    """Copies at once (``expire_reservations --processes 2``) split the backlog: when every
    run of a batch is locked by the other copy, this one reads on past those reservations
    instead of ending its pass. Another connection holds the run of the 2 oldest."""
    set_policy(acme.tenant, tenant_limit=1000, ttl_s=60)
    leased = [leased_run(acme.worker) for _ in range(3)]
    ops = []  # oldest expiry first: two on the held run, then one on each other run
    for n, (run, token) in enumerate([leased[0], leased[0], leased[1], leased[2]]):
        op = planned_op(acme, run, token, f"busy-{n}", estimate=100)
        reserve(acme.tenant, op)
        ops.append(op)
    now = timezone.now()
    for age, op in enumerate(ops):
        CostReservation.objects.filter(operation=op).update(expires_at=now - timedelta(minutes=60 - age))

    with runs_held_elsewhere([leased[0][0].pk]):
        assert reservations.reservations_expire(batch_size=2) == 2

    states = dict(CostReservation.objects.values_list("operation_id", "state"))
    assert [states[op.pk] for op in ops] == ["RESERVED", "RESERVED", "UNKNOWN", "UNKNOWN"]
    assert reservations.reservations_expire(batch_size=2) == 2  # the next pass takes them
    assert_ledger_reconciles(acme.tenant)


def test_the_expiry_task_runs_the_service(acme):
    from ledger.tasks import expire_reservations_task

    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=5)
    reserve(acme.tenant, op)
    CostReservation.objects.filter(operation=op).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert expire_reservations_task.apply().get() == {"reservations": 1}
    assert CostReservation.objects.get(operation=op).state == ReservationState.UNKNOWN


def test_the_expiry_job_is_scheduled():
    from django.conf import settings

    assert settings.CELERY_BEAT_SCHEDULE["expire-reservations"]["task"] == "ledger.tasks.expire_reservations_task"
