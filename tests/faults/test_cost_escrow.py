"""Escrow shards of the shared cost windows (issue 16, goal 3: no tenant-wide hot row).

A TENANT or PROVIDER window whose limit reaches COST_ESCROW_MIN_CENTS is charged through its
shards; here the threshold is lowered so that small, checkable limits are escrowed. What must
hold whatever the interleaving (invariant 7): reserved + settled of the window, its shards
included, never exceeds its limit; the shards are allotted exactly what the window escrowed;
a reservation is refused only when the window as a whole has no room; and every window
reconciles with its open reservations. Real processes against real PostgreSQL.
"""

import pytest
from django.db import connections

from ledger.errors import Denied
from ledger.models import CostShard, CostWindow
from ledger.services.fence.operations import operation_authorize, operation_dispatch
from ledger.services.fence.outcomes import operation_report_outcome
from ledger.states import BreakerState, BudgetKind, Outcome
from tests.factories import leased_run, planned_op, set_cost_policy
from tests.helpers import SPAWN, spawned
from tests.ledger.authority.costs import assert_invariants, breaker, reserve, settle, window

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 4
PROCESSES = 16


@pytest.fixture
def escrow(settings):
    """Windows of 1,000 cents and more are escrowed, in four shards."""
    settings.FENCELINE = {**settings.FENCELINE, "COST_ESCROW_MIN_CENTS": 1000, "COST_ESCROW_SHARDS": SHARDS}


def totals(tenant, kind, key) -> tuple[int, int, int]:
    w = CostWindow.objects.filter(pk=window(tenant, kind, key).pk).with_totals().get()
    return w.limit_cents, w.total_reserved_cents, w.total_settled_cents


def assert_escrow_holds(tenant) -> None:
    """Per window: the shards are allotted what it escrowed, and in all it holds no more
    than its limit; per shard: no more than its allotment (the check constraints say it
    too)."""
    for w in CostWindow.objects.filter(tenant=tenant).with_totals():
        shards = list(CostShard.objects.filter(window=w))
        assert len(shards) == w.shard_count
        assert sum(s.allotted_cents for s in shards) == w.escrowed_cents
        assert w.reserved_cents + w.settled_cents + w.escrowed_cents <= w.limit_cents
        assert w.total_reserved_cents + w.total_settled_cents <= w.limit_cents
        for s in shards:
            assert s.reserved_cents + s.settled_cents <= s.allotted_cents


def test_a_large_shared_window_is_charged_through_its_shards_and_holds_exactly_what_was_reserved(acme, escrow):
    set_cost_policy(acme.tenant, tenant_limit=100_000, provider={"llm": 50_000}, run=2000)
    for i in range(6):
        run, token = leased_run(acme.worker, owner=f"owner-{i}")
        reserve(acme.tenant, planned_op(acme, run, token, f"k-{i}", estimate=700, provider="llm"))

    tenant_window = window(acme.tenant, BudgetKind.TENANT, "acme")
    assert tenant_window.shard_count == SHARDS
    assert tenant_window.reserved_cents == 0  # the row itself is not charged: its shards are
    assert totals(acme.tenant, BudgetKind.TENANT, "acme") == (100_000, 4200, 0)
    assert totals(acme.tenant, BudgetKind.PROVIDER, "llm") == (50_000, 4200, 0)
    run_window = CostWindow.objects.filter(kind=BudgetKind.RUN).first()
    assert run_window.shard_count == 0  # a run's own window is never shared
    assert_escrow_holds(acme.tenant)
    assert_invariants(acme.tenant)


def test_settling_moves_the_estimate_out_and_the_actual_cost_in_on_the_same_shard(acme, escrow):
    set_cost_policy(acme.tenant, tenant_limit=10_000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k", estimate=500)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 320)
    assert totals(acme.tenant, BudgetKind.TENANT, "acme") == (10_000, 0, 320)
    assert_escrow_holds(acme.tenant)
    assert_invariants(acme.tenant)


def test_a_dry_shard_takes_headroom_from_the_window_then_from_the_other_shards(acme, escrow):
    """Every run's shard starts empty; the window hands out headroom in chunks (1000 / 16 =
    62 cents here) until it has none, and then a shard takes what the others hold spare, so
    the window's last cents are reachable from any run: 33 reservations of 30 fit in 1000."""
    set_cost_policy(acme.tenant, tenant_limit=1000)
    outcomes = []
    for i in range(40):
        run, token = leased_run(acme.worker, owner=f"owner-{i}")
        try:
            reserve(acme.tenant, planned_op(acme, run, token, f"k-{i}", estimate=30))
            outcomes.append("granted")
        except Denied as refused:
            outcomes.append(refused.extra["budget"])
        assert_escrow_holds(acme.tenant)
    assert outcomes == ["granted"] * 33 + ["tenant:cents"] * 7
    assert totals(acme.tenant, BudgetKind.TENANT, "acme") == (1000, 990, 0)
    assert_invariants(acme.tenant)


def test_an_actual_cost_over_the_estimate_takes_headroom_before_it_is_called_an_overage(acme, escrow):
    set_cost_policy(acme.tenant, tenant_limit=5000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k", estimate=100)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 900)  # more than its shard was allotted, well within the window
    assert totals(acme.tenant, BudgetKind.TENANT, "acme") == (5000, 0, 900)
    assert breaker(acme.tenant) == BreakerState.NORMAL  # no overage: the window had room
    assert_escrow_holds(acme.tenant)
    assert_invariants(acme.tenant)


def test_an_overage_of_an_escrowed_window_fills_it_and_opens_the_breaker(acme, escrow):
    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k", estimate=100)
    reserve(acme.tenant, op)
    settle(acme.tenant, op, 1500)
    assert totals(acme.tenant, BudgetKind.TENANT, "acme") == (1000, 0, 1000)  # full, never over
    assert breaker(acme.tenant) == BreakerState.OPEN
    assert_escrow_holds(acme.tenant)
    assert_invariants(acme.tenant)


def test_dispatch_and_outcome_charge_and_settle_an_escrowed_window(acme, escrow):
    """The fenced path itself (its one-statement charge and settlement)."""
    set_cost_policy(acme.tenant, tenant_limit=100_000, provider={"llm": 100_000})
    settled = 0
    for i in range(5):
        run, token = leased_run(acme.worker, owner=f"owner-{i}")
        for n in range(3):
            op = planned_op(acme, run, token, f"k-{i}-{n}", estimate=400, provider="llm")
            operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
            operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
            if n < 2:
                operation_report_outcome(
                    worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome=Outcome.CONFIRMED,
                    actual_cost_cents=150,
                )  # fmt: skip
                settled += 150
    assert totals(acme.tenant, BudgetKind.TENANT, "acme") == (100_000, 5 * 400, settled)
    assert totals(acme.tenant, BudgetKind.PROVIDER, "llm") == (100_000, 5 * 400, settled)
    assert_escrow_holds(acme.tenant)
    assert_invariants(acme.tenant)


# --- sixteen processes for the last cents of an escrowed window -----------------------------


def test_sixteen_processes_racing_for_the_last_cents_of_an_escrowed_window_get_exactly_the_limit(acme, escrow):
    set_cost_policy(acme.tenant, tenant_limit=1000, provider={"llm": 1500})
    opener, opener_token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, opener, opener_token, "opening", estimate=250, provider="llm"))
    assert window(acme.tenant, BudgetKind.TENANT, "acme").shard_count == SHARDS
    ops = []
    for i in range(PROCESSES):
        run, token = leased_run(acme.worker, owner=f"racer-{i}")
        ops.append(planned_op(acme, run, token, f"race-{i}", estimate=75, provider="llm"))
    connections.close_all()

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
    assert totals(acme.tenant, BudgetKind.TENANT, "acme") == (1000, 1000, 0)
    assert totals(acme.tenant, BudgetKind.PROVIDER, "llm")[1] == 1000
    assert_escrow_holds(acme.tenant)
    assert_invariants(acme.tenant)


def test_a_refill_and_a_committing_charger_of_the_same_window_do_not_deadlock(acme, escrow):
    """Found by `make bench --curve` at N = 16 (authority mode): a dispatch that charged a
    shard and linked its reservation to the window checks that foreign key at COMMIT with a
    KEY SHARE lock on the window row, while a refill of that window holds the row and waits
    for the dispatch's shard as a donor. With FOR UPDATE on the window the two waited for
    each other (PostgreSQL's deadlock detector killed one after a second); a refill takes
    FOR NO KEY UPDATE, which a KEY SHARE does not wait for."""
    import threading

    from django.db import connection, transaction

    from ledger.services.authority.windows import shard_refill

    set_cost_policy(acme.tenant, tenant_limit=1000)
    run, token = leased_run(acme.worker)
    reserve(acme.tenant, planned_op(acme, run, token, "k-0", estimate=30))  # opens the shards
    tenant_window = window(acme.tenant, BudgetKind.TENANT, "acme")
    donor, needy = CostShard.objects.filter(window=tenant_window).order_by("pk")[:2]
    charged, refiller_waiting, errors = threading.Event(), threading.Event(), []

    def charger():
        try:
            with transaction.atomic():
                CostShard.objects.filter(pk=donor.pk).update(reserved_cents=donor.reserved_cents)  # holds the shard
                # A row that references the window: its deferred FK check runs at COMMIT.
                CostShard.objects.create(window=tenant_window, shard=99, allotted_cents=0)
                charged.set()
                assert refiller_waiting.wait(10)
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def refiller():
        try:
            assert charged.wait(10)
            with transaction.atomic():
                shard_refill(tenant_window, needy, 10_000)  # the window row, then every donor
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=charger), threading.Thread(target=refiller)]
    for thread in threads:
        thread.start()
    assert charged.wait(10)
    blocked = False
    with connection.cursor() as cursor:  # the refiller must be blocked on the charger's shard
        for _ in range(200):
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            blocked = cursor.fetchone()[0] > 0
            if blocked:
                break
            threading.Event().wait(0.05)
    refiller_waiting.set()
    for thread in threads:
        thread.join(30)
    assert blocked, "the refiller never waited for the charger: the interleaving under test did not happen"
    assert errors == []
    CostShard.objects.filter(window=tenant_window, shard=99).delete()  # the stand-in reference
    assert_escrow_holds(acme.tenant)
