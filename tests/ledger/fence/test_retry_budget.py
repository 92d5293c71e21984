"""The retry budget is policy (issue 39, item 5): ``retry_budget.automatic_attempts`` replaces
the constant three; a retry past ``max_attempts`` or ``max_cost_cents`` is refused (403
DENY_BUDGET naming the budget) and the refusal is a RETRY_REFUSED event naming it; the budget
holds exactly under threads racing to retry against real PostgreSQL."""

import threading

import pytest
from django.db import connections

from ledger.errors import ApprovalRequired, Denied, DomainError
from ledger.models import Event, Operation
from ledger.services.fence import operations, outcomes, retry
from tests.factories import leased_run, planned_op, set_policy
from tests.helpers import assert_chain_intact


def failed_call(acme, key="llm-1", *, estimate=None, actual=None):
    """A model call dispatched and reported FAILED (costing ``actual`` cents): (run, token, op)."""
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, key, estimate=estimate, provider="openai")
    return run, token, fail(acme, op, token, actual=actual)


def fail(acme, op, token, *, actual=None) -> Operation:
    """Authorize, dispatch and report FAILED the operation's current attempt."""
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    return outcomes.operation_report_outcome(
        worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="FAILED", actual_cost_cents=actual
    )


def again(acme, op, token) -> Operation:
    return retry.operation_retry(worker=acme.worker, operation_id=op.pk, fencing_token=token)


def test_the_default_budget_keeps_three_automatic_attempts(acme):
    _, token, op = failed_call(acme)
    for attempt in (2, 3):
        op = fail(acme, again(acme, op, token), token)
        assert op.attempt == attempt
    assert retry.retry_decision_now(op) == ("APPROVAL", "3 automatic attempts spent")
    with pytest.raises(ApprovalRequired):
        again(acme, op, token)


def test_automatic_attempts_come_from_the_policy(acme):
    set_policy(acme.tenant, retry_budget={"automatic_attempts": 1})
    _, token, op = failed_call(acme)
    assert retry.retry_decision_now(op)[0] == "APPROVAL"
    with pytest.raises(ApprovalRequired):
        again(acme, op, token)


def test_a_retry_past_max_attempts_is_refused_and_the_refusal_names_the_budget(acme):
    set_policy(acme.tenant, retry_budget={"max_attempts": 2})
    run, token, op = failed_call(acme)
    op = fail(acme, again(acme, op, token), token)
    assert retry.retry_decision_now(op)[0] == "STOP"
    assert "retry_budget:attempts" in retry.retry_decision_now(op)[1]

    with pytest.raises(Denied) as refused:
        again(acme, op, token)

    assert (refused.value.code, refused.value.extra["budget"]) == ("DENY_BUDGET", "retry_budget:attempts")
    assert Operation.objects.get(pk=op.pk).attempt == 2
    event = Event.objects.get(run=run, type="RETRY_REFUSED")
    assert (event.fields["code"], event.fields["budget"], event.fields["attempt"]) == (
        "DENY_BUDGET",
        "retry_budget:attempts",
        2,
    )
    assert_chain_intact(run.pk)


def test_max_attempts_holds_even_where_a_person_would_approve(acme):
    set_policy(acme.tenant, retry_budget={"automatic_attempts": 1, "max_attempts": 1})
    _, token, op = failed_call(acme)
    with pytest.raises(Denied) as refused:
        again(acme, op, token)
    assert refused.value.extra["budget"] == "retry_budget:attempts"


def test_a_retry_once_the_attempts_cost_the_budget_is_refused_naming_the_cents(acme):
    set_policy(acme.tenant, retry_budget={"max_cost_cents": 300})
    run, token, op = failed_call(acme, estimate=200, actual=180)
    op = again(acme, op, token)  # 180 of 300 spent: allowed
    op = fail(acme, op, token, actual=150)  # 330 spent

    assert retry.attempts_cost_cents(op) == 330
    with pytest.raises(Denied) as refused:
        again(acme, op, token)

    assert refused.value.extra["budget"] == "retry_budget:cents"
    assert "330" in refused.value.detail
    assert Event.objects.get(run=run, type="RETRY_REFUSED").fields["budget"] == "retry_budget:cents"


def test_a_refusal_that_is_no_budget_leaves_the_budget_field_empty(acme):
    run, token = leased_run(acme.worker)
    op = planned_op(acme, run, token, "k")
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
    with pytest.raises(DomainError):
        again(acme, op, token)
    assert Event.objects.get(run=run, type="RETRY_REFUSED").fields["budget"] == ""


THREADS = 8


def race(acme, op, token) -> list[str]:
    """THREADS threads retry ``op`` at once; what each got (``ok`` or the refusal's code)."""
    barrier, got, lock = threading.Barrier(THREADS), [], threading.Lock()

    def one() -> None:
        try:
            barrier.wait()
            again(acme, op, token)
            answer = "ok"
        except DomainError as refused:
            answer = refused.code
        finally:
            connections.close_all()
        with lock:
            got.append(answer)

    threads = [threading.Thread(target=one) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(got)


@pytest.mark.django_db(transaction=True)
def test_threads_racing_to_retry_never_take_an_attempt_past_the_budget(acme):
    set_policy(acme.tenant, retry_budget={"max_attempts": 2})
    run, token, op = failed_call(acme)

    first = race(acme, op, token)
    assert first.count("ok") == 1 and Operation.objects.get(pk=op.pk).attempt == 2
    fail(acme, Operation.objects.get(pk=op.pk), token)

    second = race(acme, op, token)

    assert second == ["DENY_BUDGET"] * THREADS
    assert Operation.objects.get(pk=op.pk).attempt == 2
    refusals = Event.objects.filter(run=run, type="RETRY_REFUSED")
    assert refusals.filter(fields__budget="retry_budget:attempts").count() == THREADS
    assert refusals.count() == THREADS + len(first) - 1  # the first race's losers found it PLANNED
    assert_chain_intact(run.pk)
