"""deliveries_send and its entry points: two passes at once send each delivery once; a claim
left by a pass that died lapses and the delivery is sent by the next; a reference or a key
that is no longer configured is retried, not sent unsigned; the beat tasks and
``manage.py notify`` run the same services."""

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals.services.notifications import notifications_scan
from approvals.tasks import notify_scan_task
from ledger.models import JobHeartbeat, WebhookDelivery
from ledger.models.notifications import DeliveryStatus
from ledger.services.notifications.delivery import deliveries_send
from ledger.tasks import deliver_webhooks_task
from tests.factories import webhook_endpoint, worker_in
from tests.helpers import Sink, run_concurrently


@pytest.fixture
def sink():
    made = Sink((200,))
    yield made
    made.close()


def setup(tenant, target: str, quarantined: int = 1):
    made = webhook_endpoint(tenant, target)
    for i in range(quarantined):
        worker_in(tenant, "QUARANTINED", f"w-{i}")
    notifications_scan()
    return made


@pytest.mark.django_db(transaction=True)
def test_passes_at_once_send_each_delivery_once(acme, sink, settings, monkeypatch):
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_CONCURRENCY", 2)
    setup(acme.tenant, sink.url(), quarantined=12)
    results = run_concurrently(lambda i: deliveries_send(batch_size=4), 4)
    assert not [r for r in results if isinstance(r, BaseException)], results
    while deliveries_send(batch_size=4).claimed:
        pass
    ids = [r["headers"]["Fenceline-Webhook-Id"] for r in sink.requests]
    assert len(ids) == 12 and len(set(ids)) == 12
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 12


def test_a_claim_left_by_a_dead_pass_lapses_and_the_next_pass_sends(acme, sink):
    setup(acme.tenant, sink.url())
    WebhookDelivery.objects.update(claimed_until=timezone.now() + timedelta(minutes=5))  # a pass died mid-send
    assert deliveries_send().claimed == 0
    assert deliveries_send(now=timezone.now() + timedelta(minutes=6)).delivered == 1
    assert len(sink.requests) == 1


def test_a_reference_no_longer_configured_is_retried_not_sent(acme, sink, settings, monkeypatch):
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_TARGETS", {"ops-sink": sink.url()})
    setup(acme.tenant, "ref:ops-sink")
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_TARGETS", {})
    deliveries_send()
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.last_error) == (DeliveryStatus.PENDING, 1, "target_unset")
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_TARGETS", {"ops-sink": sink.url()})
    deliveries_send(now=timezone.now() + timedelta(hours=1))
    row.refresh_from_db()
    assert row.status == DeliveryStatus.DELIVERED and len(sink.requests) == 1


def test_a_signing_key_no_longer_configured_sends_nothing_unsigned(acme, sink, settings, monkeypatch):
    setup(acme.tenant, sink.url())
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_KEYS", {"other": b"k" * 32})
    deliveries_send()
    row = WebhookDelivery.objects.get()
    assert (row.status, row.last_error) == (DeliveryStatus.PENDING, "signing_key")
    assert sink.requests == []


def test_the_beat_tasks_run_the_services_and_write_their_heartbeats(acme, sink):
    webhook_endpoint(acme.tenant, sink.url())
    worker_in(acme.tenant, "QUARANTINED", "w-q")
    assert notify_scan_task() == {"endpoints": 1, "created": 1, "refused": 0}
    assert deliver_webhooks_task() == {"claimed": 1, "delivered": 1, "retrying": 0, "gave_up": 0}
    beats = dict(JobHeartbeat.objects.values_list("name", "runs"))
    assert beats["notify-scan"] == 1 and beats["deliver-webhooks"] == 1


def test_the_notify_command_scans_and_sends_printing_counts(acme, sink):
    webhook_endpoint(acme.tenant, sink.url())
    for i in range(3):
        worker_in(acme.tenant, "QUARANTINED", f"w-{i}")
    out = io.StringIO()
    call_command("notify", "--all", "--batch-size", "2", stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    assert "3 new deliveries (3 quarantine)" in text
    assert "3 deliveries sent: 3 delivered, 0 to retry later, 0 given up" in text
    assert len(sink.requests) == 3
