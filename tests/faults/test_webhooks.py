"""Webhook delivery against a real local HTTP endpoint: retries on 500 with backoff, gives up
after its budget (and at once on a 4xx), signs every body, never carries a secret (canary),
and a hanging endpoint does not slow a fenced call: the fenced path never runs any of the
notification code, proven by a profiler that watches every call while the calls are made."""

import hashlib
import hmac
import io
import json
import logging
import sys
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone

from approvals.services.notifications import notifications_scan
from ledger.models import WebhookDelivery, Worker
from ledger.models.notifications import DeliveryStatus
from ledger.services.fleet.workers import worker_create
from ledger.services.notifications import delivery as delivery_module
from ledger.services.notifications.delivery import deliveries_send
from ledger.services.notifications.endpoints import endpoint_rotate_secret
from tests.factories import active_leases, webhook_endpoint, worker_in
from tests.helpers import Sink, tables_containing

# --- a local endpoint ---------------------------------------------------------------------


@pytest.fixture
def sinks():
    made: list[Sink] = []

    def make(*answers: int, gate: threading.Event | None = None) -> Sink:
        made.append(Sink(answers or (200,), gate=gate))
        return made[-1]

    yield make
    for sink in made:
        sink.close()


def verified(secret: str, request: dict) -> bool:
    """What a receiver does (docs/operations.md): HMAC-SHA256(secret, "<t>." + raw body)."""
    parts = dict(item.split("=", 1) for item in request["headers"]["Fenceline-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(parts["v1"], expected)


def later(hours: int):
    """The test's clock: every pass runs well after the previous attempt's backoff."""
    return timezone.now() + timedelta(hours=hours)


# --- retries, budget, signatures -----------------------------------------------------------


def test_delivery_is_retried_on_500_with_growing_backoff_then_delivered(acme, sinks):
    sink = sinks(500, 503, 200)
    webhook_endpoint(acme.tenant, sink.url())
    worker_in(acme.tenant, "QUARANTINED", "w-quarantined")
    assert notifications_scan().created == 1

    first = deliveries_send()
    row = WebhookDelivery.objects.get()
    assert (first.retrying, row.status, row.attempts, row.last_status_code, row.last_error) == (
        1,
        DeliveryStatus.PENDING,
        1,
        500,
        "http_500",
    )
    first_wait = row.next_attempt_at - timezone.now()
    assert deliveries_send().claimed == 0  # not due before its backoff

    deliveries_send(now=row.next_attempt_at)
    row.refresh_from_db()
    assert (row.attempts, row.last_error) == (2, "http_503")
    assert row.next_attempt_at - timezone.now() > first_wait  # the backoff grew

    deliveries_send(now=later(2))
    row.refresh_from_db()
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == (DeliveryStatus.DELIVERED, 3, 200, "")
    assert row.delivered_at is not None
    assert len(sink.requests) == 3
    assert len({r["headers"]["Fenceline-Webhook-Id"] for r in sink.requests}) == 1  # one id across retries


def test_delivery_gives_up_after_its_budget(acme, sinks, settings, monkeypatch):
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_MAX_ATTEMPTS", 6)
    sink = sinks(500)
    webhook_endpoint(acme.tenant, sink.url())
    worker_in(acme.tenant, "QUARANTINED", "w-quarantined")
    notifications_scan()
    for hour in range(1, 10):
        deliveries_send(now=later(hour))
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == (
        DeliveryStatus.GAVE_UP,
        6,
        500,
        "http_500",
    )
    assert len(sink.requests) == 6
    # A second scan does not make the condition a new delivery.
    assert notifications_scan().created == 0
    assert deliveries_send(now=later(24)).claimed == 0


@pytest.mark.parametrize(
    ("code", "status", "requests_made"), [(404, "GAVE_UP", 1), (410, "GAVE_UP", 1), (429, "PENDING", 1)]
)
def test_a_4xx_gives_up_at_once_but_429_is_retried(acme, sinks, code, status, requests_made):
    sink = sinks(code)
    webhook_endpoint(acme.tenant, sink.url())
    worker_in(acme.tenant, "QUARANTINED", "w-quarantined")
    notifications_scan()
    deliveries_send()
    row = WebhookDelivery.objects.get()
    assert (row.status, row.last_status_code, row.last_error) == (status, code, f"http_{code}")
    assert len(sink.requests) == requests_made


def test_an_endpoint_that_refuses_connections_is_retried_as_connection(acme, sinks):
    sink = sinks(200)
    url = sink.url()
    sink.close()  # nothing listens there any more
    webhook_endpoint(acme.tenant, url)
    worker_in(acme.tenant, "QUARANTINED", "w-quarantined")
    notifications_scan()
    deliveries_send()
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == (
        DeliveryStatus.PENDING,
        1,
        None,
        "connection",
    )


def test_every_body_is_signed_with_the_endpoint_secret_and_rotation_changes_it(acme, sinks):
    sink = sinks(200)
    created = webhook_endpoint(acme.tenant, sink.url(), kinds=["quarantine", "breaker_change"])
    worker_in(acme.tenant, "QUARANTINED", "w-1")
    worker_in(acme.tenant, "QUARANTINED", "w-2")
    notifications_scan()
    deliveries_send()
    assert len(sink.requests) == 2
    ids = {str(pk) for pk in WebhookDelivery.objects.values_list("pk", flat=True)}
    for request in sink.requests:
        assert request["headers"]["Content-Type"] == "application/json"
        assert request["headers"]["Fenceline-Webhook-Id"] in ids
        assert verified(created.secret, request)
        body = json.loads(request["body"])
        assert body["fenceline"]["kind"] == "quarantine"
        assert body["fenceline"]["tenant"] == "acme"
        assert body["text"].startswith("[acme] Worker w-")
    tampered = {**sink.requests[0], "body": sink.requests[0]["body"].replace(b"w-", b"x-")}
    assert not verified(created.secret, tampered)

    rotated = endpoint_rotate_secret(
        tenant=acme.tenant, endpoint_id=created.endpoint.pk, reason="rotate after a leak drill", changed_by="alice"
    )
    assert rotated.secret != created.secret
    worker_in(acme.tenant, "QUARANTINED", "w-3")
    notifications_scan()
    deliveries_send()
    assert verified(rotated.secret, sink.requests[-1])
    assert not verified(created.secret, sink.requests[-1])


# --- secrets -------------------------------------------------------------------------------

CANARY = "CANARYwebhook7f3a9c1e"
LEGACY = "LEGACYreason4b8d2e6a"


def test_no_secret_reaches_the_database_the_request_or_a_log_line(acme, sinks, settings, monkeypatch):
    sink = sinks(200)
    # A Slack-style target: the secret is in the URL's path, so only its reference is stored.
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_TARGETS", {"ops-slack": sink.url(f"/services/T0/B0/{CANARY}")})
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.DEBUG)
    for name in settings.LOGGING["handlers"]["console"]["filters"]:
        handler.addFilter(_filter(name))  # the configured handler's filters, in order
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    try:
        created = webhook_endpoint(
            acme.tenant, "ref:ops-slack", kinds=["quarantine", "cleanup_alert", "approval_pending"]
        )
        active_leases(acme, 2)  # credential leases exist while the conditions are scanned
        worker_in(acme.tenant, "QUARANTINED", "w-quarantined")
        # A legacy row whose stored reason holds a credential: its body is refused, never sent.
        leaky, _ = worker_create(tenant=acme.tenant, name="w-leaky")
        Worker.objects.filter(pk=leaky.pk).update(status="QUARANTINED", status_reason=f"password={LEGACY}")
        scan = notifications_scan()
        sent = deliveries_send()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)

    assert (scan.created, scan.refused, sent.delivered) == (2, 1, 1)
    refused = WebhookDelivery.objects.get(status=DeliveryStatus.GAVE_UP)
    assert (refused.last_error, refused.body, refused.attempts) == ("secret_boundary", {}, 0)
    assert len(sink.requests) == 1
    assert sink.requests[0]["path"] == f"/services/T0/B0/{CANARY}"  # the reference was resolved
    assert verified(created.secret, sink.requests[0])
    for secret in (CANARY, created.secret):
        assert tables_containing(secret) == []
        assert secret not in stream.getvalue()
        sent_bytes = sink.requests[0]["body"] + json.dumps(sink.requests[0]["headers"]).encode()
        assert secret.encode() not in sent_bytes
        for row in WebhookDelivery.objects.values():
            assert secret not in json.dumps(row, default=str)
    # The planted legacy reason is only where it was planted: not in a delivery, not sent.
    assert tables_containing(LEGACY) == ["ledger_worker"]
    assert LEGACY not in stream.getvalue()
    assert LEGACY.encode() not in sink.requests[0]["body"]
    assert "refused by the secret boundary" in stream.getvalue()


def _filter(dotted: str):
    from ledger import logfilter

    spec = {"withhold_exception_messages": "WithholdExceptionMessages", "withhold_credentials": "WithholdCredentials"}
    return getattr(logfilter, spec[dotted])()


# --- a hanging endpoint and the fenced path --------------------------------------------------


def fenced_calls(identity, owner: str = "worker-a") -> list[int]:
    """lease, intent, authorize, dispatch, outcome through the worker API (Django's test
    client, in this thread): the statuses, in order."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {identity.token}")

    def post(path: str, body: dict):
        return client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")

    created = post("/runs", {"schema_version": 1})
    run_id = created.json()["run_id"]
    lease = post(f"/runs/{run_id}/lease", {"owner_id": owner, "ttl_s": 30})
    token = lease.json()["fencing_token"]
    intent = post(
        f"/runs/{run_id}/operations",
        {
            "fencing_token": token,
            "tool": "email",
            "action": "send",
            "resource": "mailto:ops@example.com",
            "effect_class": "NON_RETRYABLE",
            "idempotency_key": f"mail-{run_id}",
        },
    )
    op_id = intent.json()["operation_id"]
    authorize = post(f"/operations/{op_id}/authorize", {"fencing_token": token})
    dispatch = post(f"/operations/{op_id}/dispatch", {"fencing_token": token})
    outcome = post(
        f"/operations/{op_id}/outcome", {"fencing_token": token, "outcome": "CONFIRMED", "provider_request_id": "m-1"}
    )
    return [r.status_code for r in (created, lease, intent, authorize, dispatch, outcome)]


@pytest.mark.django_db(transaction=True)
def test_a_hanging_endpoint_does_not_slow_a_fenced_call(acme, sinks, settings, monkeypatch):
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_TIMEOUT_S", 120)  # longer than the test
    gate = threading.Event()
    sink = sinks(200, gate=gate)
    webhook_endpoint(acme.tenant, sink.url())
    worker_in(acme.tenant, "QUARANTINED", "w-quarantined")
    notifications_scan()

    outcome: dict = {}

    def deliver():
        try:
            outcome["pass"] = deliveries_send()
        finally:
            connections.close_all()

    job = threading.Thread(target=deliver)
    job.start()
    try:
        assert sink.arrived.wait(30), "the delivery never reached the endpoint"
        # The endpoint holds the delivery job's request open; the control plane answers.
        statuses = [fenced_calls(acme, owner=f"worker-{i}") for i in range(3)]
        assert job.is_alive() and not gate.is_set()  # still blocked while every call completed
        assert all(s == [201, 200, 201, 200, 200, 200] for s in statuses), statuses
    finally:
        gate.set()
        job.join(60)
    assert not job.is_alive()
    assert outcome["pass"].delivered == 1
    assert WebhookDelivery.objects.get().status == DeliveryStatus.DELIVERED


def test_the_fenced_path_never_runs_notification_code(acme, sinks):
    """Every Python call made while the fenced calls run is watched: none is in
    ledger/services/notifications/ (so no endpoint, however slow, can be on that path)."""
    sink = sinks(200)
    webhook_endpoint(acme.tenant, sink.url(), kinds=["quarantine", "approval_pending", "breaker_change"])
    package = delivery_module.__file__.rsplit("/", 1)[0]
    seen: list[str] = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(watch)
    threading.setprofile(watch)
    try:
        statuses = fenced_calls(acme)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert statuses == [201, 200, 201, 200, 200, 200]
    assert seen == []
    assert WebhookDelivery.objects.count() == 0
    assert sink.requests == []
