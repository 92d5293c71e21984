"""The cost services called as authorize / dispatch / outcome call them: inside the caller's
transaction, with the run and its lease locked, events gathered in a ChainBatch that the
caller commits. Shared by the cost tests here and tests/faults/test_cost_breaker.py and
test_cost_escrow.py (limits are set with tests.factories.set_cost_policy, operations built
with tests.factories.planned_op)."""

from contextlib import contextmanager

from django.db import connections, transaction
from django.utils import timezone

from ledger.errors import Denied
from ledger.models import CostReservation, CostWindow, Event, Operation, Run, Tenant
from ledger.services.authority import reservations, windows
from ledger.services.authority.breaker import breaker_allows
from ledger.services.authority.policy import policy_current
from ledger.services.core.fencing import lock_run
from ledger.services.evidence.append import ChainBatch
from tests.helpers import assert_chain_intact

ACTOR = "worker:worker-1/owner-a"


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


# --- the article's invariants -------------------------------------------------------------


def assert_ledger_reconciles(tenant) -> None:
    """The article's invariant: each window's reserved cents are exactly the estimates of
    its open reservations, and no window holds more than its limit."""
    for w in CostWindow.objects.filter(tenant=tenant):
        assert reservations.window_reconciles(w), f"{w.kind}:{w.key} does not reconcile"
        assert w.reserved_cents + w.settled_cents <= w.limit_cents


def assert_attributable(tenant) -> None:
    """One reservation per operation and attempt, each announced once in its own run."""
    for reservation in CostReservation.objects.filter(tenant=tenant):
        assert reservation.run_id == Operation.objects.get(pk=reservation.operation_id).run_id
        announced = Event.objects.filter(
            type="COST_RESERVED",
            fields__reservation_id=str(reservation.pk),
        )
        assert [(e.run_id, e.fields["attempt"]) for e in announced] == [(reservation.run_id, reservation.attempt)]


def assert_invariants(tenant) -> None:
    assert_ledger_reconciles(tenant)
    assert_attributable(tenant)
    for run_id in Run.objects.filter(tenant=tenant).values_list("pk", flat=True):
        assert_chain_intact(run_id)


# --- a process racing for the last cents (tests.helpers.spawned runs it) --------------------


def reserve_in_a_race(tenant_id, op_id, barrier, results):
    """Reserve ``op_id``'s estimate once every racer is at the barrier; put (op id, outcome)."""
    try:
        tenant = Tenant.objects.get(pk=tenant_id)
        op = Operation.objects.get(pk=op_id)
        barrier.wait(60)
        with under_lock(tenant, op.run_id) as (run, batch):
            _, policy = policy_current(tenant=tenant)
            reservations.cost_reserve(op=op, run=run, policy=policy, batch=batch, actor=ACTOR, now=batch.now)
        results.put((str(op_id), "granted"))
    except Denied as refused:
        results.put((str(op_id), refused.extra["budget"]))
    except BaseException as exc:
        results.put((str(op_id), f"error {type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()
