"""POST /api/v1/webhooks/deliveries/{source}: providers' signed delivery webhooks, both
styles, valid, invalid and replayed, over the test client (no worker token)."""

import hashlib
import hmac
import json
import time

import pytest
import requests
from django.test import Client

from ledger.models import EffectDelivery, EffectDeliveryRecord, Event
from tests.factories import confirm, dispatched_operation, leased_run
from tests.helpers import assert_chain_intact

SECRET = "whsec_test_only_4f1c2a"
MESSAGE_ID = "<m-7@acme.example>"


@pytest.fixture
def sources(settings, monkeypatch, tmp_path, acme):
    monkeypatch.setenv("FL_TEST_STRIPE_SECRET", SECRET)
    secret_file = tmp_path / "github-secret"
    secret_file.write_text(SECRET + "\n")
    settings.FENCELINE = {
        **settings.FENCELINE,
        "DELIVERY_SOURCES": {
            "mailer": {
                "style": "stripe",
                "secret": "env:FL_TEST_STRIPE_SECRET",
                "tenant": "acme",
                "tolerance_s": 300,
                "map": {
                    "by": "message_id",
                    "message_id": "data.object.message_id",
                    "status": "data.object.status",
                    "provider_event_id": "id",
                    "occurred_at": "created",
                    "statuses": {"delivered": "DELIVERED", "bounced": "BOUNCED", "deferred": "DEFERRED"},
                },
            },
            "hooks": {
                "style": "github",
                "secret": f"file:{secret_file}",
                "tenant": "acme",
                "tolerance_s": 300,
                "map": {"by": "operation_key", "provider_event_id": "header:X-GitHub-Delivery"},
            },
        },
    }


@pytest.fixture
def sent(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "mail-7")
    confirm(acme.worker, op, token, provider_request_id=MESSAGE_ID)
    return run, op


def stripe_event(status, event_id="evt_1", created=None):
    return {
        "id": event_id,
        "created": created or int(time.time()),
        "data": {"object": {"message_id": MESSAGE_ID, "status": status}},
    }


def stripe_post(body: bytes, *, secret=SECRET, stamp=None, header=None, tamper=b""):
    stamp = int(time.time()) if stamp is None else stamp
    signature = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    header = header if header is not None else f"t={stamp},v1={signature}"
    return Client().post(
        "/api/v1/webhooks/deliveries/mailer",
        data=body + tamper,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=header,
    )


def github_post(body: bytes, *, secret=SECRET, delivery="gh-1", header=None):
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return Client().post(
        "/api/v1/webhooks/deliveries/hooks",
        data=body,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=header if header is not None else signature,
        HTTP_X_GITHUB_DELIVERY=delivery,
    )


def nothing_written(run):
    return not EffectDeliveryRecord.objects.exists() and not Event.objects.filter(type="DELIVERY_RECORDED").exists()


def test_a_stripe_signed_webhook_records_the_delivery_as_the_provider(sources, sent):
    run, op = sent
    answer = stripe_post(json.dumps(stripe_event("deferred")).encode())
    assert answer.status_code == 201, answer.content
    answer = stripe_post(json.dumps(stripe_event("delivered", "evt_2")).encode())
    assert (answer.status_code, answer.json()["delivery"]["status"]) == (201, "DELIVERED")
    assert EffectDelivery.objects.get(operation=op).state == "DELIVERED"
    event = Event.objects.filter(run=run, type="DELIVERY_RECORDED").order_by("-seq").first()
    assert event.actor == "provider:mailer"
    assert (event.fields["provider_event_id"], event.fields["message_id"]) == ("evt_2", MESSAGE_ID)
    assert SECRET not in json.dumps([e.fields for e in Event.objects.filter(run=run)])
    assert_chain_intact(run.pk)


def test_a_github_signed_webhook_finds_the_operation_by_its_key(sources, sent):
    _run, op = sent
    body = json.dumps({"operation_key": "mail-7", "status": "BOUNCED", "occurred_at": "2026-12-06T10:00:00Z"}).encode()
    answer = github_post(body)
    assert answer.status_code == 201, answer.content
    record = EffectDeliveryRecord.objects.get(operation=op)
    assert (record.state, record.provider_event_id, record.actor) == ("BOUNCED", "gh-1", "provider:hooks")


@pytest.mark.parametrize(
    "post",
    [
        lambda body: stripe_post(body, secret="whsec_wrong"),
        lambda body: stripe_post(body, header=""),
        lambda body: stripe_post(body, header="t=abc,v1=00"),
        lambda body: stripe_post(body, header=f"t={int(time.time())},v1=\u00e9\u00e9"),
        lambda body: stripe_post(body, tamper=b" "),  # the body changed after signing
        lambda body: stripe_post(body, stamp=int(time.time()) - 3600),  # outside the tolerance: a replay
        lambda body: stripe_post(body, stamp=int(time.time()) + 3600),
    ],
    ids=["wrong-secret", "missing", "malformed", "not-ascii", "body-changed", "old-timestamp", "future-timestamp"],
)
def test_a_bad_stripe_signature_is_refused_and_writes_nothing(sources, sent, post):
    run, _ = sent
    body = json.dumps(stripe_event("delivered")).encode()
    answer = post(body)
    assert (answer.status_code, answer.json()["error"]) == (401, "BAD_SIGNATURE")
    assert SECRET not in answer.content.decode()
    assert nothing_written(run)


@pytest.mark.parametrize(
    "header",
    ["", "sha1=abc", "sha256=" + "0" * 64, "sha256=\u00e9\u00e9"],
    ids=["missing", "wrong-scheme", "wrong", "not-ascii"],
)
def test_a_bad_github_signature_is_refused_and_writes_nothing(sources, sent, header):
    run, _ = sent
    body = json.dumps({"operation_key": "mail-7", "status": "DELIVERED", "occurred_at": 1765000000}).encode()
    answer = github_post(body, header=header)
    assert (answer.status_code, answer.json()["error"]) == (401, "BAD_SIGNATURE")
    assert nothing_written(run)


def test_a_replayed_webhook_within_the_window_is_recorded_once(sources, sent):
    run, _ = sent
    body = json.dumps(stripe_event("delivered")).encode()
    first, again = stripe_post(body), stripe_post(body)
    assert (first.status_code, again.status_code, again.json()["replayed"]) == (201, 200, True)
    assert Event.objects.filter(run=run, type="DELIVERY_RECORDED").count() == 1
    github = json.dumps({"operation_key": "mail-7", "status": "DELIVERED", "occurred_at": 1765000000}).encode()
    assert github_post(github, delivery="gh-9").status_code == 201
    assert github_post(github, delivery="gh-9").status_code == 200
    assert EffectDeliveryRecord.objects.count() == 2


def test_an_unknown_source_or_an_unreadable_secret_is_refused(sources, sent, monkeypatch):
    run, _ = sent
    body = json.dumps(stripe_event("delivered")).encode()
    answer = Client().post("/api/v1/webhooks/deliveries/nobody", data=body, content_type="application/json")
    assert (answer.status_code, answer.json()["error"]) == (404, "NOT_FOUND")
    monkeypatch.delenv("FL_TEST_STRIPE_SECRET")
    assert stripe_post(body).status_code == 401
    assert nothing_written(run)


def test_a_signed_webhook_naming_no_known_message_is_not_found(sources, sent):
    run, _ = sent
    event = stripe_event("delivered")
    event["data"]["object"]["message_id"] = "<other@acme.example>"
    answer = stripe_post(json.dumps(event).encode())
    assert (answer.status_code, answer.json()["error"]) == (404, "NOT_FOUND")
    assert nothing_written(run)


@pytest.mark.django_db(transaction=True)
def test_a_provider_posts_over_real_http_without_a_worker_token_or_csrf(sources, sent, live_server):
    _run, op = sent
    body = json.dumps(stripe_event("delivered", "evt_http")).encode()
    stamp = int(time.time())
    signature = hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    answer = requests.post(
        f"{live_server.url}/api/v1/webhooks/deliveries/mailer",
        data=body,
        headers={"Content-Type": "application/json", "Stripe-Signature": f"t={stamp},v1={signature}"},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    assert EffectDelivery.objects.get(operation=op).state == "DELIVERED"
