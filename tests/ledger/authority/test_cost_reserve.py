"""Reserving a worst-case estimate (ledger/services/authority/reservations.py and
windows.py): windows aligned to the epoch, every applicable key charged once or none at all,
one reservation per attempt, and the database's own check behind invariant 7. The cost
services are called as authorize and dispatch call them (tests/ledger/authority/costs.py)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.errors import Denied, InvalidInput
from ledger.models import CostReservation, CostWindow, Operation
from ledger.services.authority import reservations, windows
from ledger.services.authority.policy import policy_current
from ledger.services.fence import operations
from ledger.states import BudgetKind, ReservationState
from tests.factories import leased_run, planned_op, set_cost_policy
from tests.helpers import assert_chain_intact, events_of
from tests.ledger.authority.costs import (
    ACTOR,
    assert_ledger_reconciles,
    new_attempt,
    reserve,
    settle,
    under_lock,
    window,
)

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
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1")
    with pytest.raises(Denied) as refused:
        reserve(acme.tenant, op)
    assert refused.value.code == "DENY_BUDGET"
    assert refused.value.extra["budget"] == "estimate"
    assert "worst-case" in refused.value.detail


def test_a_limit_on_another_provider_does_not_need_an_estimate(acme):
    set_cost_policy(acme.tenant, provider={"premium-llm": 1000})
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
    set_cost_policy(acme.tenant, run=500, tenant_limit=1000, retry=200, provider={"premium-llm": 800, "other": 5})
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
    set_cost_policy(acme.tenant, run=500)
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
    set_cost_policy(acme.tenant, run=500)
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
    set_cost_policy(acme.tenant, tenant_limit=1000, retry=250)
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
    set_cost_policy(acme.tenant, run=5000, tenant_limit=5000, provider={"premium-llm": 1000})
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
    set_cost_policy(acme.tenant, tenant_limit=100)
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
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k1", estimate=300)
    first = reserve(acme.tenant, op)
    again = reserve(acme.tenant, op)
    assert again.pk == first.pk
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 300
    assert len(events_of(run, "COST_RESERVED")) == 1


def test_the_database_refuses_a_window_over_its_limit(acme):
    """The check constraint behind invariant 7, whatever code tries it."""
    set_cost_policy(acme.tenant, tenant_limit=1000)
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
