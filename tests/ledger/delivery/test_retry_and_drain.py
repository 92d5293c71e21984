"""A retry of a NON_RETRYABLE send asks its delivery first; a refused retry is an event in the
chain; drain reports the deliveries still pending."""

import json

import pytest
from django.test import Client
from django.utils import timezone

from ledger.errors import AlreadyDelivered, ApprovalRequired, ReconcileFirst
from ledger.models import Event, Operation, WorkerDrain
from ledger.services.delivery.record import report_checked
from ledger.services.fence import outcomes, retry
from ledger.services.fence.deliveries import delivery_record
from ledger.services.fleet.lifecycle import worker_change
from tests.factories import dispatched_operation, leased_run
from tests.helpers import assert_chain_intact

MESSAGE_ID = "<m-3@acme.example>"


def failed_send(acme, key="mail-3", effect_class="NON_RETRYABLE"):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, key, effect_class)
    outcomes.operation_report_outcome(
        worker=acme.worker,
        operation_id=op.pk,
        fencing_token=token,
        outcome="FAILED",
        provider_request_id=MESSAGE_ID,
        error_code="SMTP_TIMEOUT",
    )
    return run, token, op


def delivered(acme, op, token, state, event_id):
    report = report_checked(state=state, message_id=MESSAGE_ID, provider_event_id=event_id, occurred_at=timezone.now())
    return delivery_record(worker=acme.worker, operation_id=op.pk, fencing_token=token, report=report)


@pytest.mark.parametrize("state", ["DELIVERED", "DEFERRED"])
def test_a_retry_of_a_delivered_send_is_refused_and_the_refusal_is_in_the_chain(acme, state):
    run, token, op = failed_send(acme)
    delivered(acme, op, token, state, "evt-1")
    with pytest.raises(AlreadyDelivered) as refused:
        retry.operation_retry(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    assert refused.value.body()["delivery_state"] == state
    assert Operation.objects.get(pk=op.pk).attempt == 1
    event = Event.objects.get(run=run, type="RETRY_REFUSED")
    assert (event.fields["code"], event.fields["decision"], event.fields["operation_id"]) == (
        "ALREADY_DELIVERED",
        "APPROVAL",
        str(op.pk),
    )
    assert_chain_intact(run.pk)


def test_a_bounced_send_goes_to_a_person_as_before(acme):
    run, token, op = failed_send(acme)
    delivered(acme, op, token, "BOUNCED", "evt-1")
    with pytest.raises(ApprovalRequired):
        retry.operation_retry(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    assert not Event.objects.filter(run=run, type="RETRY_REFUSED").exists()


def test_a_retry_refused_over_the_api_answers_409_already_delivered(acme):
    _run, token, op = failed_send(acme)
    delivered(acme, op, token, "DELIVERED", "evt-1")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {acme.token}")
    answer = client.post(
        f"/api/v1/operations/{op.pk}/retry", data=json.dumps({"fencing_token": token}), content_type="application/json"
    )
    assert (answer.status_code, answer.json()["error"], answer.json()["message_id"]) == (
        409,
        "ALREADY_DELIVERED",
        MESSAGE_ID,
    )


def test_a_retry_while_unknown_is_refused_with_an_event(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "mail-4")
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
    with pytest.raises(ReconcileFirst):
        retry.operation_retry(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    event = Event.objects.get(run=run, type="RETRY_REFUSED")
    assert (event.fields["code"], event.fields["decision"]) == ("RECONCILE_FIRST", "RECONCILE")


def test_other_classes_are_not_asked_about_delivery(acme):
    _run, token, op = failed_send(acme, "mail-5", "IDEMPOTENT")
    delivered(acme, op, token, "DELIVERED", "evt-1")
    assert retry.operation_retry(worker=acme.worker, operation_id=op.pk, fencing_token=token).attempt == 2


def test_drain_reports_the_deliveries_still_pending(acme):
    _run, token, op = failed_send(acme)
    delivered(acme, op, token, "DEFERRED", "evt-1")
    _, token2, other = failed_send(acme, "mail-6")
    delivered(acme, other, token2, "DELIVERED", "evt-2")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {acme.token}")
    answer = client.post(
        "/api/v1/workers/me/drain", data=json.dumps({"deadline_s": 60}), content_type="application/json"
    )
    assert (answer.status_code, answer.json()["deliveries_pending"]) == (200, 1)
    worker_change(worker_id=acme.worker.pk, action="resume", reason="back", deadline_s=None, user=None, name="ops")
    assert WorkerDrain.objects.get(worker=acme.worker).deliveries_pending == 1
