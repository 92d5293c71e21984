"""The Python client's lease.delivery and its ALREADY_DELIVERED refusal, over HTTP."""

import pytest

from fenceline_client import client as fl
from ledger.models import EffectDelivery


@pytest.fixture
def worker(live_server, acme):
    return fl.Client(live_server.url, acme.token)


def test_a_worker_records_delivery_and_a_resend_is_refused(worker):
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=30) as lease:
        done = lease.operation(
            tool="email",
            action="send",
            resource="mailto:ops@example.com",
            effect_class="NON_RETRYABLE",
            idempotency_key="mail:client-1",
            perform=lambda: fl.Done(outcome="FAILED", provider_request_id="<c-1@acme.example>", error_code="SMTP_421"),
        )
        operation_id = done["operation_id"]
        recorded = lease.delivery(
            operation_id,
            status="DEFERRED",
            message_id="<c-1@acme.example>",
            provider_event_id="evt-c1",
            occurred_at="2026-12-06T10:00:00Z",
        )
        assert (recorded["applied"], recorded["delivery"]["status"]) == (True, "DEFERRED")
        with pytest.raises(fl.AlreadyDelivered) as refused:
            lease.post(f"/operations/{operation_id}/retry")
        assert refused.value.body["delivery_state"] == "DEFERRED"
        lease.complete()
    assert EffectDelivery.objects.get(operation_id=operation_id).state == "DEFERRED"
