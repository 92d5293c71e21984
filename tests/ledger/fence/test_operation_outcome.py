import pytest

from approvals.models import ReconciliationCase
from ledger.errors import StaleToken, WrongPhase
from ledger.models import Event, Operation
from ledger.services.fence import operations, outcomes
from tests.factories import dispatched_operation, expire, intended_operation, leased_run, planned_op, set_cost_policy


def report(acme, op, token, outcome, **extra):
    return outcomes.operation_report_outcome(
        worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome=outcome, **extra
    )


@pytest.mark.parametrize("outcome", ["CONFIRMED", "FAILED"])
def test_outcome_closes_a_dispatched_operation(acme, outcome):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "k")
    report(acme, op, token, outcome, provider_request_id="p-1", error_code="E_TIMEOUT" if outcome == "FAILED" else "")
    op.refresh_from_db()
    assert (op.phase, op.provider_request_id) == (outcome, "p-1")
    assert not ReconciliationCase.objects.filter(operation=op).exists()


def test_unknown_outcome_opens_one_case(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "k")
    report(acme, op, token, "UNKNOWN", error_code="READ_TIMEOUT")
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"
    case = ReconciliationCase.objects.get(operation=op)
    assert (case.reason, case.status) == ("WORKER_REPORTED_UNKNOWN", "OPEN")
    event = Event.objects.get(run=run, type="OPERATION_UNKNOWN")
    assert event.fields["case_id"] == str(case.pk)
    assert event.fields["error_code"] == "READ_TIMEOUT"


def test_unknown_cannot_be_reported_into_success(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "k")
    report(acme, op, token, "UNKNOWN")
    with pytest.raises(WrongPhase):
        report(acme, op, token, "CONFIRMED", provider_request_id="p-9")
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"


def test_outcome_before_dispatch_is_wrong_phase(acme):
    run, token = leased_run(acme.worker)
    op = intended_operation(acme.worker, run, token, "k", "PURE")
    with pytest.raises(WrongPhase):
        report(acme, op, token, "CONFIRMED")


def test_stale_outcome_of_an_expired_dispatch_turns_it_unknown_with_its_evidence(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "k")
    expire(run)
    with pytest.raises(StaleToken):
        report(acme, op, token, "CONFIRMED", provider_request_id="late-1")
    op.refresh_from_db()
    assert op.phase == "UNKNOWN" and op.provider_request_id == ""
    case = ReconciliationCase.objects.get(operation=op)
    assert [e["provider_request_id"] for e in case.unverified_evidence] == ["late-1"]
    run.refresh_from_db()
    assert run.stale_rejections == 1


def test_usage_reported_after_a_failure_without_it_settles_the_reservation(acme):
    from ledger.models import CostReservation, Tenant

    set_cost_policy(acme.tenant, tenant_limit=10_000)
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k", estimate=100, effect_class="PURE")
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    report(acme, op, token, "FAILED", error_code="HTTP_500")  # no usage
    assert CostReservation.objects.get(operation=op).state == "UNKNOWN"
    assert Tenant.objects.get(pk=acme.tenant.pk).breaker_state == "UNKNOWN"

    report(acme, op, token, "FAILED", error_code="HTTP_500", actual_cost_cents=40)  # the usage arrives
    reservation = CostReservation.objects.get(operation=op)
    assert (reservation.state, reservation.actual_cents) == ("SETTLED", 40)
    assert Tenant.objects.get(pk=acme.tenant.pk).breaker_state == "NORMAL"
