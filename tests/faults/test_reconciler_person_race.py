"""A reconciler and people racing to settle one UNKNOWN operation, 16 processes against real
PostgreSQL: exactly one decision wins, with one RECONCILED event; every other one is refused
with the case's current state and writes nothing."""

import multiprocessing

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from approvals.models import ReconciliationCase
from ledger.models import Event, Operation
from ledger.services.core.intent import Intent
from ledger.services.fence import operations, outcomes
from tests.factories import leased_run
from tests.helpers import SPAWN, assert_chain_intact, spawned

PROCESSES = 16

pytestmark = pytest.mark.django_db(transaction=True)


def process(entry: str, *args) -> multiprocessing.Process:
    """A started process running ``entry(*args)`` of this module against the test database."""
    return spawned("tests.faults.test_reconciler_person_race", entry, *args)


def _decide(who: str, case_id: str, barrier, results) -> None:
    from approvals.services import lookups
    from approvals.services.cases import case_resolve
    from ledger.errors import WrongPhase
    from ledger.services.reconciliation.protocol import Lookup, Verdict

    try:
        case = ReconciliationCase.objects.select_related("operation").get(pk=case_id)
        answer = lookups._Answer(
            Lookup(
                Verdict.HAPPENED, asked="GET /v1/charges?idempotency_key=race", status=200, provider_request_id="ch_9"
            )
        )
        user = get_user_model().objects.get(username="olga")
        barrier.wait(60)
        if who == "reconciler":
            results.put((who, lookups._settle(case, answer)))
        else:
            try:
                case_resolve(case_id=case_id, user=user, resolution="DID_NOT_HAPPEN", reason="checked by hand")
                results.put((who, "won"))
            except WrongPhase:
                results.put((who, "lost"))
    except BaseException as exc:
        results.put((who, f"error {type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()


def test_a_reconciler_and_people_racing_on_one_operation_make_one_decision_and_one_event(acme, settings):
    get_user_model().objects.create_superuser("olga", password="x")
    run, token = leased_run(acme.worker)
    op, _ = operations.operation_intend(
        worker=acme.worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="payments",
            action="charge",
            resource="c:1",
            effect_class="NON_RETRYABLE",
            idempotency_key="race",
            provider="sandbox-payments",
        ),
    )
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
    case = ReconciliationCase.objects.get(operation=op)
    assert case.status == "LOOKUP"
    connections.close_all()

    barrier, results = SPAWN.Barrier(PROCESSES), SPAWN.Queue()
    racers = [
        process("_decide", "reconciler" if i % 2 == 0 else "person", str(case.pk), barrier, results)
        for i in range(PROCESSES)
    ]
    outcomes_seen = [results.get(timeout=180) for _ in racers]
    for racer in racers:
        racer.join(60)
        assert racer.exitcode == 0

    assert not [o for o in outcomes_seen if o[1].startswith("error")], outcomes_seen
    winners = [o for o in outcomes_seen if o[1] in ("won", "happened")]
    assert len(winners) == 1, outcomes_seen
    assert sum(1 for o in outcomes_seen if o[1] == "lost") == PROCESSES - 1
    assert Event.objects.filter(run=run, type="OPERATION_RECONCILED").count() == 1
    case.refresh_from_db()
    op = Operation.objects.get(pk=op.pk)
    assert case.status == "RESOLVED" and op.phase == "RECONCILED"
    who = winners[0][0]
    if who == "reconciler":
        assert (case.resolved_by, op.reconciliation) == ("reconciler:sandbox-payments", "HAPPENED")
        assert Event.objects.filter(run=run, type="CASE_LOOKED_UP").count() == 1
    else:
        assert (case.resolved_by, op.reconciliation) == ("olga", "DID_NOT_HAPPEN")
        assert not Event.objects.filter(run=run, type="CASE_LOOKED_UP").exists()
    assert_chain_intact(run.pk)
