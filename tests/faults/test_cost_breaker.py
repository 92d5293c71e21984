"""Failure injection for the cost circuit breaker: the nine cases of the article "Your AI
Agent Needs a Cost Circuit Breaker, Not a Monthly Budget", one test each, and a race of
16 processes for the last cents of a budget.

Every test asserts the article's invariants at the end:

* the ledger reconciles: each window's ``reserved_cents`` is exactly the estimates of its
  open (RESERVED or UNKNOWN) reservations, and no window exceeds its limit;
* no reservation is silently lost: an ambiguous one is UNKNOWN and still counted;
* nothing bypasses the breaker: a refused guard is backed by a refusing window;
* every charge is attributable to exactly one run and attempt (one reservation per
  operation and attempt, one COST_RESERVED event for it, in its run's chain).

Concurrency uses real threads and processes, each with its own PostgreSQL connection and
transaction, so these tests are ``transaction=True``: the other sessions only see what
was committed. Processes are started with multiprocessing's ``spawn`` method (a fresh
interpreter, never a fork of a test session that may run a live server thread); each one
sets Django up and connects to the pytest-django test database named by the parent.
"""

import multiprocessing
import os
import signal
import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from ledger.actors import SYSTEM_RESERVATION_EXPIRY
from ledger.errors import Denied
from ledger.models import CostReservation, CostWindow, Event, Operation, Run, Tenant
from ledger.services.authority import reservations, windows
from ledger.services.authority.policy import policy_current
from ledger.services.evidence.append import ChainBatch
from ledger.states import BreakerState, BudgetKind, ReservationState
from tests.factories import leased_run, planned_op, set_cost_policy
from tests.helpers import SPAWN, events_of, run_concurrently, spawned
from tests.ledger.authority.costs import (
    ACTOR,
    allows,
    assert_invariants,
    breaker,
    mark_unknown,
    new_attempt,
    reserve,
    resolve,
    settle,
    under_lock,
    window,
)

PROCESSES = 16


def process(entry: str, *args) -> multiprocessing.Process:
    """A started process running ``entry(*args)`` of this module against the test database."""
    return spawned("tests.faults.test_cost_breaker", entry, *args)


pytestmark = pytest.mark.django_db(transaction=True)


def reserve_outcome(tenant, op):
    """What a dispatching worker sees: 'granted' or the refused budget."""
    try:
        reserve(tenant, op)
        return "granted"
    except Denied as refused:
        return refused.extra["budget"]


# --- 1. two workers reserve the final available cents concurrently ---------------------------


def test_two_workers_reserving_the_final_cents_one_gets_them(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    first_run, first_token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, first_run, first_token, "earlier", estimate=700))
    contenders = []
    for i in range(2):
        run, token = leased_run(acme.worker, owner=f"worker-{i}")
        contenders.append(planned_op(acme, run, token, f"final-{i}", estimate=300))

    results = run_concurrently(lambda i: reserve_outcome(acme.tenant, contenders[i]), 2)

    assert sorted(results) == ["granted", "tenant:cents"], results
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (w.reserved_cents, w.limit_cents) == (1000, 1000)
    assert CostReservation.objects.filter(operation__in=contenders).count() == 1
    assert breaker(acme.tenant) == BreakerState.OPEN
    assert_invariants(acme.tenant)


# --- 2. the provider times out after accepting the request ----------------------------------------


def test_a_provider_timeout_after_accept_keeps_the_estimate_as_unknown(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, provider={"llm": 1000})
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "summarize", estimate=300, provider="llm")
    reserve(acme.tenant, op)

    # The worker's call timed out: it reports UNKNOWN (or loses its lease); the outcome
    # service turns the operation UNKNOWN and hands its reservation to the cost service.
    assert mark_unknown(acme.tenant, [op], reason="worker_reported_unknown") == 1

    reservation = CostReservation.objects.get(operation=op)
    assert reservation.state == ReservationState.UNKNOWN  # not released: it may have been billed
    assert window(acme.tenant, BudgetKind.PROVIDER, "llm").reserved_cents == 300
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    assert allows(acme.tenant, op, retry=True).extra["budget"] == "tenant:breaker"  # no automatic retry
    assert_invariants(acme.tenant)

    # Reconciliation finds the provider's record: 260 cents were billed.
    resolve(acme.tenant, op, 260)
    assert CostReservation.objects.get(operation=op).state == ReservationState.SETTLED
    assert window(acme.tenant, BudgetKind.PROVIDER, "llm").settled_cents == 260
    assert breaker(acme.tenant) == BreakerState.NORMAL
    assert_invariants(acme.tenant)


# --- 3. usage data arrives late or is missing ------------------------------------------------------


def test_late_or_missing_usage_never_frees_the_budget_early(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    missing = planned_op(acme, run, token, "missing", estimate=300)
    late = planned_op(acme, run, token, "late", estimate=200)
    reserve(acme.tenant, missing)
    reserve(acme.tenant, late)

    settle(acme.tenant, missing, None)  # CONFIRMED without usage
    CostReservation.objects.filter(operation=late).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert reservations.reservations_expire() == 1  # the report is late: the reservation times out

    states = dict(CostReservation.objects.values_list("operation_id", "state"))
    assert states == {missing.pk: "UNKNOWN", late.pk: "UNKNOWN"}
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 500  # both still counted
    assert [e.fields["reason"] for e in events_of(run, "COST_UNKNOWN")] == ["usage missing", "reservation expired"]
    assert_invariants(acme.tenant)

    settle(acme.tenant, late, 150)  # the late report with its usage settles it after all
    resolve(acme.tenant, missing, 280)  # reconciliation finds the missing usage
    w = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert (w.reserved_cents, w.settled_cents) == (0, 430)
    assert breaker(acme.tenant) == BreakerState.NORMAL
    assert_invariants(acme.tenant)


# --- 4. a retry is attempted after the breaker opens --------------------------------------------


def test_a_retry_after_the_breaker_opens_is_refused_by_guard_and_window(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, retry=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "flaky", estimate=400)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 400)  # attempt 1 failed, and was billed
    reserve(acme.tenant, planned_op(acme, run, token, "big", estimate=600))
    assert breaker(acme.tenant) == BreakerState.OPEN

    retry = new_attempt(op, 2)
    refusal = allows(acme.tenant, retry, retry=True)
    assert (refusal.code, refusal.extra["budget"]) == ("DENY_BUDGET", "tenant:breaker")
    # Even a caller that skipped the guard gets nothing: the window refuses the retry.
    assert reserve_outcome(acme.tenant, retry) == "tenant:cents"
    assert not CostReservation.objects.filter(operation=op, attempt=2).exists()
    assert not CostWindow.objects.filter(kind=BudgetKind.RETRY, reserved_cents__gt=0).exists()
    assert_invariants(acme.tenant)


# --- 5. a premium fallback is requested while the provider budget is exhausted -------------------


def test_a_premium_fallback_is_checked_like_any_call_and_refused_naming_the_provider(acme):
    set_cost_policy(acme.tenant, run=5000, tenant_limit=5000, provider={"cheap-llm": 2000, "premium-llm": 1000})
    run, token = leased_run(acme.worker)
    earlier = planned_op(acme, run, token, "earlier-premium", estimate=900, provider="premium-llm")
    reserve(acme.tenant, earlier)
    settle(acme.tenant, earlier, 880)
    primary = planned_op(acme, run, token, "summarize", estimate=100, provider="cheap-llm")
    reserve(acme.tenant, primary)
    mark_unknown(acme.tenant, [primary], reason="worker_reported_unknown")  # the cheap model timed out
    before = {(w.kind, w.key): (w.reserved_cents, w.settled_cents) for w in CostWindow.objects.all()}

    fallback = planned_op(acme, run, token, "summarize-premium", estimate=300, provider="premium-llm")
    assert allows(acme.tenant, fallback) is None  # new work, not a retry: the guard lets it ask
    with pytest.raises(Denied) as refused:
        reserve(acme.tenant, fallback)

    assert refused.value.extra["budget"] == "provider:cents"
    assert refused.value.detail == "provider budget for 'premium-llm' has 120 of 1000 cents left; this needs 300"
    after = {(w.kind, w.key): (w.reserved_cents, w.settled_cents) for w in CostWindow.objects.all()}
    assert after == before  # no key kept a part of the refused fallback
    assert not CostReservation.objects.filter(operation=fallback).exists()
    assert_invariants(acme.tenant)


# --- 6. a process crashes after reservation, before settlement ------------------------------------


def _reserve_then_die(tenant_id, op_id):
    tenant = Tenant.objects.get(pk=tenant_id)
    reserve(tenant, Operation.objects.get(pk=op_id))  # committed
    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies before it ever reports


def test_a_crash_after_reservation_leaves_an_unknown_reservation_not_a_lost_one(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, ttl_s=60)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "crashing", estimate=300)
    worker = process("_reserve_then_die", acme.tenant.pk, op.pk)
    worker.join(120)
    assert worker.exitcode == -signal.SIGKILL

    reservation = CostReservation.objects.get(operation=op)
    assert reservation.state == ReservationState.RESERVED
    CostReservation.objects.filter(pk=reservation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    out = StringIO()
    call_command("expire_reservations", stdout=out, stderr=StringIO())

    assert out.getvalue().strip() == "expired 1 cost reservations; they are now UNKNOWN"
    assert CostReservation.objects.get(pk=reservation.pk).state == ReservationState.UNKNOWN
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 300
    [event] = events_of(run, "COST_UNKNOWN")
    assert event.actor == SYSTEM_RESERVATION_EXPIRY
    assert breaker(acme.tenant) == BreakerState.UNKNOWN
    assert_invariants(acme.tenant)


# --- 7. a process crashes after settlement, before releasing the unused estimate ----------------


def _settle_then_die(tenant_id, op_id, settled_event):
    tenant = Tenant.objects.get(pk=tenant_id)
    op = Operation.objects.get(pk=op_id)
    with under_lock(tenant, op.run_id) as (run, batch):
        reservations.cost_settle(op=op, run=run, actual_cents=120, batch=batch, actor=ACTOR, now=batch.now)
        batch.commit()
        settled_event.set()
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)  # dies with the settlement written, not committed


def test_a_crash_after_settlement_leaves_no_half_settled_reservation(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, provider={"llm": 1000})
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "settling", estimate=300, provider="llm")
    reserve(acme.tenant, op)
    settled = SPAWN.Event()
    worker = process("_settle_then_die", acme.tenant.pk, op.pk, settled)
    assert settled.wait(120)
    worker.join(60)
    assert worker.exitcode == -signal.SIGKILL

    with transaction.atomic():  # waits, if need be, for the server to roll the dead session back
        reservation = CostReservation.objects.select_for_update().get(operation=op)
    assert reservation.state == ReservationState.RESERVED
    for kind, key in ((BudgetKind.TENANT, "acme"), (BudgetKind.PROVIDER, "llm")):
        w = window(acme.tenant, kind, key)
        assert (w.reserved_cents, w.settled_cents) == (300, 0)  # all of it, or none of it
    assert not events_of(run, "COST_SETTLED")
    assert_invariants(acme.tenant)

    # The retried report settles and releases in one step, once.
    settle(acme.tenant, op, 120)
    settle(acme.tenant, op, 120)
    for kind, key in ((BudgetKind.TENANT, "acme"), (BudgetKind.PROVIDER, "llm")):
        w = window(acme.tenant, kind, key)
        assert (w.reserved_cents, w.settled_cents) == (0, 120)
    assert len(events_of(run, "COST_SETTLED")) == 1
    assert_invariants(acme.tenant)


# --- 8. the clock moves across a budget-window boundary --------------------------------------------


def test_a_window_boundary_opens_a_fresh_window_and_leaves_the_old_one_alone(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, window_s=3600)
    run, token = leased_run(acme.worker)
    boundary, _ = windows.window_bounds(timezone.now(), 3600)
    before, after = boundary - timedelta(seconds=1), boundary + timedelta(seconds=1)
    old = planned_op(acme, run, token, "before", estimate=900)
    new = planned_op(acme, run, token, "after", estimate=900)

    reserve(acme.tenant, old, now=before)
    assert breaker(acme.tenant) == BreakerState.DEGRADED
    reserve(acme.tenant, new, now=after)  # 900 + 900 > 1000, but in different windows
    settle(acme.tenant, old, 700, now=after + timedelta(seconds=1))  # settles where it was reserved

    old_window = window(acme.tenant, BudgetKind.TENANT, "acme", now=before, window_s=3600)
    new_window = window(acme.tenant, BudgetKind.TENANT, "acme", now=after, window_s=3600)
    assert old_window.pk != new_window.pk
    assert (old_window.starts_at, old_window.ends_at) == (boundary - timedelta(hours=1), boundary)
    assert (old_window.reserved_cents, old_window.settled_cents) == (0, 700)
    assert (new_window.reserved_cents, new_window.settled_cents) == (900, 0)
    assert list(CostReservation.objects.get(operation=old).windows.all()) == [old_window]
    assert list(CostReservation.objects.get(operation=new).windows.all()) == [new_window]
    assert breaker(acme.tenant) == BreakerState.DEGRADED  # judged by the new window (90%)
    assert_invariants(acme.tenant)


# --- 9. a duplicate message is delivered to two workers --------------------------------------------


def _waiting_on_a_lock(db_name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            [db_name],
        )
        return cursor.fetchone()[0] > 0


def test_a_duplicate_message_to_two_workers_is_reserved_once(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, run, token, "warm-up", estimate=100))  # the window exists
    op = planned_op(acme, run, token, "dispatch-once", estimate=300)

    # Delivered twice to workers that both get through: the second waits for the first on
    # the unique (operation, attempt) index, then gets the first one's reservation.
    first_reserved, release_first = threading.Event(), threading.Event()
    results = {}

    def first():
        with transaction.atomic():
            locked = Run.objects.get(pk=run.pk)
            _, policy = policy_current(tenant=acme.tenant)
            batch = ChainBatch(timezone.now())
            results["first"] = reservations.cost_reserve(
                op=Operation.objects.get(pk=op.pk), run=locked, policy=policy, batch=batch, actor=ACTOR, now=batch.now
            )
            batch.commit()
            first_reserved.set()
            assert release_first.wait(30)
        connections.close_all()

    def second():
        assert first_reserved.wait(30)
        with transaction.atomic():
            _, policy = policy_current(tenant=acme.tenant)
            results["second"] = reservations.cost_reserve(
                op=Operation.objects.get(pk=op.pk),
                run=Run.objects.get(pk=run.pk),
                policy=policy,
                batch=ChainBatch(timezone.now()),
                actor=ACTOR,
                now=timezone.now(),
            )
        connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_reserved.wait(30)
    db_name = connection.settings_dict["NAME"]
    deadline = time.monotonic() + 30
    while not _waiting_on_a_lock(db_name):
        assert time.monotonic() < deadline, "the second delivery never reached the unique index"
        time.sleep(0.01)
    release_first.set()
    for thread in threads:
        thread.join(30)

    assert results["second"].pk == results["first"].pk
    assert CostReservation.objects.filter(operation=op).count() == 1
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 400  # counted once
    # Serialized by the run lock (the normal path), a third delivery also gets the same one.
    assert reserve(acme.tenant, op).pk == results["first"].pk
    assert window(acme.tenant, BudgetKind.TENANT, "acme").reserved_cents == 400
    assert_invariants(acme.tenant)


# --- a race of 16 processes for the last cents ----------------------------------------------------------


def test_sixteen_processes_racing_for_the_last_cents_get_exactly_the_limit(acme):
    set_cost_policy(acme.tenant, tenant_limit=1000, provider={"llm": 1500})
    opener, opener_token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, opener, opener_token, "opening", estimate=250, provider="llm"))
    ops = []
    for i in range(PROCESSES):
        run, token = leased_run(acme.worker, owner=f"racer-{i}")
        ops.append(planned_op(acme, run, token, f"race-{i}", estimate=75, provider="llm"))
    connections.close_all()  # the racers open their own connections; the parent keeps none open

    barrier = SPAWN.Barrier(PROCESSES)
    results = SPAWN.Queue()
    racers = [
        spawned("tests.ledger.authority.costs", "reserve_in_a_race", acme.tenant.pk, op.pk, barrier, results)
        for op in ops
    ]
    outcomes = dict(results.get(timeout=180) for _ in racers)
    for racer in racers:
        racer.join(60)
        assert racer.exitcode == 0

    assert not [o for o in outcomes.values() if o.startswith("error")], outcomes
    granted = [op_id for op_id, outcome in outcomes.items() if outcome == "granted"]
    assert len(granted) == 10, outcomes  # (1000 - 250) / 75: the last cents, and not one more
    assert set(outcomes.values()) == {"granted", "tenant:cents"}
    tenant_window = window(acme.tenant, BudgetKind.TENANT, "acme")
    provider_window = window(acme.tenant, BudgetKind.PROVIDER, "llm")
    assert tenant_window.reserved_cents == tenant_window.limit_cents == 1000
    assert provider_window.reserved_cents == 1000  # every grant was charged on both keys
    assert set(CostReservation.objects.filter(operation__in=ops).values_list("operation_id", flat=True)) == {
        op.pk for op in ops if str(op.pk) in granted
    }
    assert breaker(acme.tenant) == BreakerState.OPEN
    changes = Event.objects.filter(type="BREAKER_CHANGED", run__tenant=acme.tenant)
    assert changes.filter(fields__to="OPEN").count() == 1
    assert_invariants(acme.tenant)
