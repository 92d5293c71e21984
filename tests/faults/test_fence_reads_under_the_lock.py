"""The fence reads the operation in the statement that locks its run (issue 16). A statement
that had to wait for that lock started from a snapshot taken before the holder's commit; the
operation it read may since have moved, and the fence must notice and read it again rather
than decide on the stale row. Real threads, real PostgreSQL transactions."""

import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.actors import worker_actor
from ledger.errors import WrongPhase
from ledger.models import Operation
from ledger.services.core.fencing import Fenced, lock, lock_run
from ledger.services.core.phases import transition
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.operations import operation_dispatch
from ledger.states import EffectClass, Phase
from tests.factories import intended_operation, leased_run
from tests.helpers import assert_chain_intact

pytestmark = pytest.mark.django_db(transaction=True)


def authorized_operation(acme):
    run, token = leased_run(acme.worker, ttl_s=600)
    op = intended_operation(acme.worker, run, token, "k-1", EffectClass.IDEMPOTENT, authorize=True)
    return acme.worker, run, op, token


def hold_the_run_and_dispatch(worker, run_id, op_id, token, locked: threading.Event, release: threading.Event):
    """Another transaction: lock the run, dispatch the operation, wait, commit."""
    try:
        with transaction.atomic():
            run = lock_run(tenant=worker.tenant, run_id=run_id)
            now = timezone.now()
            ctx = Fenced(
                run=run, batch=ChainBatch(now), now=now, actor=worker_actor(worker, "owner-a"), fencing_token=token
            )
            op = Operation.objects.get(pk=op_id)
            transition(op, Phase.DISPATCHED, ctx, dispatched_at=now, fencing_token=token, dispatch_owner_id="owner-a")
            ctx.batch.commit()
            locked.set()
            release.wait(10)
    finally:
        connection.close()


def wait_until_blocked_on_a_lock(timeout: float = 10) -> None:
    """Until some other backend of this database waits for a lock (the caller's statement)."""
    import time

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("nobody waited for the run's lock")


def run_while_the_run_is_held(worker, run, op, token, fn):
    """``fn`` in a thread, started while another transaction holds the run and has moved
    the operation; that transaction commits once ``fn``'s statement waits for the lock."""
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_the_run_and_dispatch, args=(worker, run.pk, op.pk, token, locked, release))
    holder.start()
    assert locked.wait(10)
    outcome: dict = {}

    def call():
        try:
            outcome["value"] = fn()
        except Exception as exc:
            outcome["error"] = exc
        finally:
            connection.close()

    waiter = threading.Thread(target=call)
    waiter.start()
    wait_until_blocked_on_a_lock()
    release.set()
    holder.join(10)
    waiter.join(10)
    return outcome


def test_a_lock_that_waited_reads_the_operation_as_the_holder_left_it(acme):
    worker, run, op, token = authorized_operation(acme)

    def locked_phase():
        with transaction.atomic():
            return lock(tenant=worker.tenant, operation_id=op.pk).operation.phase

    outcome = run_while_the_run_is_held(worker, run, op, token, locked_phase)

    assert outcome == {"value": Phase.DISPATCHED}


def test_a_dispatch_that_waited_for_the_lock_sees_the_effect_already_dispatched(acme):
    worker, run, op, token = authorized_operation(acme)

    outcome = run_while_the_run_is_held(
        worker, run, op, token, lambda: operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)
    )

    refusal = outcome["error"]
    assert isinstance(refusal, WrongPhase)
    assert refusal.extra["phase"] == Phase.DISPATCHED  # the phase it is in, not "changed concurrently"
    assert Operation.objects.get(pk=op.pk).phase == Phase.DISPATCHED
    types = [e.type for e in assert_chain_intact(run.pk)]
    assert types.count("OPERATION_DISPATCHED") == 1
