"""What each racing process of tests/faults/test_flow_control_race.py runs: its own Django
setup and database connection (tests.helpers.spawned), dispatching real operations."""

from django.db import connections

from ledger.errors import Throttled
from ledger.models import Operation, Worker
from ledger.services.fence import operations, outcomes


def _dispatch(worker: Worker, op_id: str, token: int) -> str:
    try:
        operations.operation_dispatch(worker=worker, operation_id=op_id, fencing_token=token)
        return "admitted"
    except Throttled as refused:
        return f"throttled {refused.extra['key']}"


def _in_flight(tenant_id: object) -> int:
    return Operation.objects.filter(tenant_id=tenant_id, phase="DISPATCHED").count()


def concurrency_racer(worker_id, token, rounds, churn, go, counted, results, ready, released):
    """Each round k: report on ``ready`` and wait for ``go[k]``; dispatch this round's
    operation and report (op, outcome, DISPATCHED seen just after) on ``results``; wait for
    ``counted[k]`` (the test has counted what is in flight); then confirm it if it was
    admitted and report it on ``released``. Then churn: dispatch and at once confirm each operation of ``churn``,
    reporting what was in flight each time."""
    try:
        worker = Worker.objects.select_related("tenant").get(pk=worker_id)
        for k, op_id in enumerate(rounds):
            ready.put(op_id)
            go[k].wait(300)
            outcome = _dispatch(worker, op_id, token)
            results.put((op_id, outcome, _in_flight(worker.tenant_id)))
            counted[k].wait(300)
            if outcome == "admitted":
                outcomes.operation_report_outcome(
                    worker=worker, operation_id=op_id, fencing_token=token, outcome="CONFIRMED"
                )
                released.put(op_id)
        go[len(rounds)].wait(300)
        for op_id in churn:
            outcome = _dispatch(worker, op_id, token)
            results.put((op_id, outcome, _in_flight(worker.tenant_id)))
            if outcome == "admitted":
                outcomes.operation_report_outcome(
                    worker=worker, operation_id=op_id, fencing_token=token, outcome="CONFIRMED"
                )
    except BaseException as exc:
        results.put(("", f"error {type(exc).__name__}: {exc}", 0))
    finally:
        connections.close_all()


def rate_racer(worker_id, token, op_ids, barrier, results):
    """Once everyone is at the barrier, dispatch each of ``op_ids`` in turn; report the
    outcomes, all at once."""
    seen = []
    try:
        worker = Worker.objects.select_related("tenant").get(pk=worker_id)
        barrier.wait(300)
        for op_id in op_ids:
            seen.append((op_id, _dispatch(worker, op_id, token)))
    except BaseException as exc:
        seen.append(("", f"error {type(exc).__name__}: {exc}"))
    finally:
        results.put(seen)
        connections.close_all()
