"""The run page shows each operation's delivery apart from its phase: a badge with the
current state and the history of records (a late DEFERRED kept, the state unchanged); the
worker page's drains show the deliveries still pending."""

from django.urls import reverse
from django.utils import timezone

from ledger.services.delivery.record import report_checked
from ledger.services.fence.deliveries import delivery_record
from ledger.services.fleet.lifecycle import worker_drain
from tests.factories import confirm, dispatched_operation, leased_run, new_run
from tests.helpers import Browser


def record(acme, op, token, state, event_id):
    report = report_checked(
        state=state, message_id="<r-1@acme.example>", provider_event_id=event_id, occurred_at=timezone.now()
    )
    delivery_record(worker=acme.worker, operation_id=op.pk, fencing_token=token, report=report)


def test_a_viewer_sees_the_delivery_badge_and_its_history(viewer_client, acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "mail-page")
    confirm(acme.worker, op, token, provider_request_id="<r-1@acme.example>")
    record(acme, op, token, "DELIVERED", "evt-page-1")
    record(acme, op, token, "DEFERRED", "evt-page-2")
    body = viewer_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert 'class="badge delivery-delivered badge-ok">DELIVERED</span>' in body
    assert "2 records" in body and "evt-page-1" in body and "evt-page-2" in body
    assert "(kept, state unchanged)" in body
    assert ">CONFIRMED</span>" in body  # the phase is its own


def test_an_operation_without_delivery_evidence_shows_none(viewer_client, acme):
    run, token = leased_run(acme.worker)
    dispatched_operation(acme.worker, run, token, "mail-none")
    body = viewer_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "delivery-" not in body


def test_another_tenants_run_with_deliveries_is_404(outsider_viewer_client, acme):
    assert outsider_viewer_client.get(reverse("run_detail", args=[new_run(acme.worker).pk])).status_code == 404


def test_an_open_drain_shows_the_deliveries_still_pending_on_the_worker_page(viewer, acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "mail-drain")
    record(acme, op, token, "DEFERRED", "evt-drain-1")
    worker_drain(worker_id=acme.worker.pk, reason="maintenance", name="ops")
    page = Browser(viewer).get(reverse("worker_detail", args=[acme.worker.pk]))
    (drain,) = page.context["drains"]
    assert drain.deliveries_pending == 1
    assert 'data-label="deliveries pending"><span class="badge badge-warn">1</span>' in page.content.decode()
