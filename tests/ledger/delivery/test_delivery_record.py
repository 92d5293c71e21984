"""POST /api/v1/operations/{id}/deliveries over the test client: delivery evidence apart
from the outcome, fenced, idempotent per provider_event_id, with its own events."""

import json

import pytest
from django.test import Client

from ledger.models import EffectDelivery, EffectDeliveryRecord, Event
from tests.factories import confirm, dispatched_operation, expire, intended_operation, leased_run
from tests.helpers import assert_chain_intact

WHEN = "2026-12-06T10:00:00+00:00"


def call(identity, path, body=None, method="post"):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {identity.token}")
    if method == "get":
        return client.get(f"/api/v1{path}")
    return client.post(f"/api/v1{path}", data=json.dumps(body), content_type="application/json")


def report(identity, op, token, status, event_id, message_id="<m-1@acme.example>", **extra):
    body = {
        "fencing_token": token,
        "status": status,
        "message_id": message_id,
        "provider_event_id": event_id,
        "occurred_at": WHEN,
        **extra,
    }
    return call(identity, f"/operations/{op.pk}/deliveries", body)


@pytest.fixture
def sent(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "mail-1")
    confirm(acme.worker, op, token, provider_request_id="<m-1@acme.example>")
    return run, token, op


def test_delivery_is_recorded_apart_from_the_outcome_with_its_own_event(acme, sent):
    run, token, op = sent
    answer = report(acme, op, token, "DEFERRED", "evt-1")
    assert answer.status_code == 201, answer.content
    assert answer.json()["delivery"]["status"] == "DEFERRED"
    answer = report(acme, op, token, "DELIVERED", "evt-2")
    assert (answer.status_code, answer.json()["applied"]) == (201, True)
    got = call(acme, f"/operations/{op.pk}", method="get").json()
    assert (got["phase"], got["delivery"]["status"], got["delivery"]["message_id"]) == (
        "CONFIRMED",
        "DELIVERED",
        "<m-1@acme.example>",
    )
    events = Event.objects.filter(run=run, type="DELIVERY_RECORDED").order_by("seq")
    assert [(e.fields["status"], e.fields["previous_status"], e.fields["applied"]) for e in events] == [
        ("DEFERRED", None, True),
        ("DELIVERED", "DEFERRED", True),
    ]
    assert events[1].actor == "worker:worker-1/owner-a"
    assert_chain_intact(run.pk)


def test_a_late_deferred_after_delivered_is_kept_but_moves_nothing(acme, sent):
    _run, token, op = sent
    report(acme, op, token, "DELIVERED", "evt-1")
    answer = report(acme, op, token, "DEFERRED", "evt-2")
    assert (answer.status_code, answer.json()["applied"], answer.json()["delivery"]["status"]) == (
        201,
        False,
        "DELIVERED",
    )
    assert EffectDelivery.objects.get(operation=op).state == "DELIVERED"
    assert list(EffectDeliveryRecord.objects.filter(operation=op).order_by("pk").values_list("state", "applied")) == [
        ("DELIVERED", True),
        ("DEFERRED", False),
    ]
    # BOUNCED after DELIVERED: final states do not move either.
    assert report(acme, op, token, "BOUNCED", "evt-3").json()["applied"] is False


def test_the_same_provider_event_twice_is_recorded_once(acme, sent):
    run, token, op = sent
    first = report(acme, op, token, "DEFERRED", "evt-1")
    again = report(acme, op, token, "DEFERRED", "evt-1")
    assert (first.status_code, again.status_code, again.json()["replayed"]) == (201, 200, True)
    assert again.json()["seq"] == first.json()["seq"]
    assert Event.objects.filter(run=run, type="DELIVERY_RECORDED").count() == 1
    other = report(acme, op, token, "DELIVERED", "evt-1")
    assert (other.status_code, other.json()["error"]) == (422, "IDEMPOTENCY_MISMATCH")
    assert other.json()["fields"][0]["field"] == "provider_event_id"


def test_a_stale_token_cannot_record_a_delivery(acme, sent):
    run, token, op = sent
    expire(run)
    answer = report(acme, op, token, "DELIVERED", "evt-1")
    assert (answer.status_code, answer.json()["error"]) == (409, "STALE_TOKEN")
    assert not EffectDeliveryRecord.objects.exists()
    assert Event.objects.filter(run=run, type="STALE_TOKEN_REJECTED").count() == 1


def test_an_operation_never_dispatched_has_nothing_delivered(acme):
    run, token = leased_run(acme.worker)
    op = intended_operation(acme.worker, run, token, "mail-2")
    answer = report(acme, op, token, "DELIVERED", "evt-1")
    assert (answer.status_code, answer.json()["error"]) == (409, "WRONG_PHASE")
    assert not EffectDeliveryRecord.objects.exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"status": "OPENED"}, "status"),
        ({"occurred_at": "yesterday"}, "occurred_at"),
        ({"occurred_at": "2026-12-06T10:00:00"}, "occurred_at"),
        ({"provider_event_id": ""}, "provider_event_id"),
        ({"message_id": "Bearer abcdefghijklmnopqrstuvwxyz0123456789"}, "message_id"),
    ],
)
def test_bad_input_names_its_field_and_writes_nothing(acme, sent, change, field):
    run, token, op = sent
    body = {"status": "DELIVERED", "provider_event_id": "evt-1", "message_id": "m", **change}
    answer = report(acme, op, token, body.pop("status"), body.pop("provider_event_id"), **body)
    assert answer.status_code == 422, answer.content
    assert field in json.dumps(answer.json()["fields"] if "fields" in answer.json() else answer.json())
    assert not EffectDeliveryRecord.objects.exists()
    assert not Event.objects.filter(run=run, type="DELIVERY_RECORDED").exists()


def test_another_tenants_operation_is_not_found(acme, outsider, sent):
    _run, token, op = sent
    answer = report(outsider, op, token, "DELIVERED", "evt-1")
    assert answer.status_code == 404
    assert not EffectDeliveryRecord.objects.exists()


def test_delivery_records_are_append_only(acme, sent):
    from django.db import DatabaseError, transaction

    _run, token, op = sent
    report(acme, op, token, "DELIVERED", "evt-1")
    with pytest.raises(DatabaseError), transaction.atomic():
        EffectDeliveryRecord.objects.filter(operation=op).update(state="BOUNCED")
