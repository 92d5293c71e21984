"""notifications_scan: each condition becomes one delivery per endpoint that asks for its
kind, whatever how often (or how concurrently) the scan runs; only the endpoint's tenant;
nothing for disabled endpoints; UNKNOWN only past the endpoint's threshold; a breaker change
only after the endpoint was set up; bodies are Slack-compatible and allow-listed."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ReconciliationCase
from approvals.services.cases import case_escalate
from approvals.services.notifications import notifications_scan
from ledger.models import ResourceAlert, Run, Tenant, WebhookDelivery
from ledger.models.notifications import NotificationKind
from ledger.services.lifespan.reaper import resources_reap
from ledger.services.notifications.endpoints import endpoint_disable
from tests.factories import (
    leased_run,
    pending_approvals,
    stuck_resource,
    unknown_case,
    user_with,
    webhook_endpoint,
    worker_in,
)
from tests.helpers import run_concurrently

ALL = list(NotificationKind.values)


def keys() -> list[tuple[str, str]]:
    return sorted(WebhookDelivery.objects.values_list("kind", "dedupe_key"))


def every_condition(identity) -> dict[str, object]:
    """One of each of the seven conditions on ``identity``'s tenant, through the services
    where a worker or a job makes them (the verifier's BROKEN mark and the breaker's change
    are written as those services write them)."""
    case = unknown_case(identity.worker)
    escalated = unknown_case(identity.worker, key="escalated-1")
    case_escalate(case_id=escalated.pk, user=user_with("operator", identity.tenant), reason="provider ticket needed")
    approval = pending_approvals(identity.worker)[0]
    stuck_resource(identity.worker)
    resources_reap()
    alert = ResourceAlert.objects.get()
    quarantined = worker_in(identity.tenant, "QUARANTINED", "w-q")
    run, _ = leased_run(identity.worker, owner="broken-one")
    Run.objects.filter(pk=run.pk).update(broken_reason="hash_mismatch", broken_first_seq=2, broken_last_seq=2)
    Tenant.objects.filter(pk=identity.tenant.pk).update(
        breaker_state="OPEN", breaker_reason="spend past the daily limit", breaker_changed_at=timezone.now()
    )
    return {
        "case": case,
        "escalated": escalated,
        "approval": approval,
        "alert": alert,
        "worker": quarantined,
        "run": run,
    }


def test_each_condition_becomes_one_delivery_and_a_second_scan_adds_none(acme):
    made = webhook_endpoint(acme.tenant, kinds=ALL).endpoint
    found = every_condition(acme)
    # The UNKNOWN has been open for an hour (the approval is still pending: not expired).
    ReconciliationCase.objects.filter(pk=found["case"].pk).update(opened_at=timezone.now() - timedelta(hours=1))

    first = notifications_scan()
    assert first.created == 7 and first.refused == 0
    assert first.by_kind == dict.fromkeys(ALL, 1)
    by_kind = dict(keys())
    assert by_kind["unknown_aged"] == f"unknown:{found['case'].pk}"
    assert by_kind["approval_pending"] == f"approval:{found['approval'].pk}"
    assert by_kind["cleanup_alert"] == f"cleanup:{found['alert'].pk}"
    assert by_kind["quarantine"].startswith(f"quarantine:{found['worker'].pk}:")
    assert by_kind["chain_broken"] == f"broken:{found['run'].pk}"
    assert by_kind["breaker_change"].startswith(f"breaker:{acme.tenant.pk}:OPEN:")
    assert by_kind["case_escalated"] == f"escalated:{found['escalated'].pk}"
    assert notifications_scan().created == 0
    assert WebhookDelivery.objects.filter(endpoint=made).count() == 7


def test_bodies_are_slack_compatible_and_carry_only_ids_kinds_and_stored_reasons(acme, settings, monkeypatch):
    monkeypatch.setitem(settings.FENCELINE, "CONSOLE_URL", "https://fenceline.example.com")
    webhook_endpoint(acme.tenant, kinds=["quarantine", "chain_broken"])
    found = every_condition(acme)
    notifications_scan()
    bodies = {d.kind: d.body for d in WebhookDelivery.objects.all()}
    quarantine = bodies["quarantine"]
    assert quarantine["text"].startswith("[acme] Worker w-q quarantined")
    assert quarantine["blocks"][0]["text"]["text"] == quarantine["text"]
    assert quarantine["fenceline"]["kind"] == "quarantine" and quarantine["fenceline"]["tenant"] == "acme"
    assert quarantine["fenceline"]["subject"]["worker_id"] == found["worker"].pk
    assert quarantine["fenceline"]["console_url"] == f"https://fenceline.example.com/workers/{found['worker'].pk}/"
    broken = bodies["chain_broken"]["fenceline"]
    assert broken["subject"] == {
        "run_id": str(found["run"].pk),
        "broken_reason": "hash_mismatch",
        "first_seq": 2,
        "last_seq": 2,
    }


def test_a_stored_reason_is_escaped_for_slack(acme):
    webhook_endpoint(acme.tenant, kinds=["quarantine"])
    worker = worker_in(acme.tenant, "ACCEPTING", "w-x")
    from ledger.services.fleet.lifecycle import worker_quarantine

    worker_quarantine(worker_id=worker.pk, reason="<!channel> look at <https://evil.example|this>", name="bob")
    notifications_scan()
    text = WebhookDelivery.objects.get().body["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text


def test_unknown_waits_for_the_endpoints_threshold(acme):
    webhook_endpoint(acme.tenant, kinds=["unknown_aged"], unknown_after_s=600)
    case = unknown_case(acme.worker)
    assert notifications_scan(now=case.opened_at + timedelta(seconds=599)).created == 0
    assert notifications_scan(now=case.opened_at + timedelta(seconds=600)).created == 1


def test_only_the_endpoints_tenant_only_its_kinds_and_never_when_disabled(acme, outsider):
    ours = webhook_endpoint(acme.tenant, kinds=["quarantine"]).endpoint
    quiet = webhook_endpoint(acme.tenant, kinds=["quarantine"], name="quiet").endpoint
    endpoint_disable(tenant=acme.tenant, endpoint_id=quiet.pk, reason="on holiday", changed_by="alice")
    webhook_endpoint(outsider.tenant, kinds=["chain_broken"], name="theirs")
    worker_in(outsider.tenant, "QUARANTINED", "their-q")  # another tenant's condition
    mine = worker_in(acme.tenant, "QUARANTINED", "our-q")
    run, _ = leased_run(acme.worker)
    Run.objects.filter(pk=run.pk).update(broken_reason="hash_mismatch")  # a kind ours does not ask for
    assert notifications_scan().created == 1
    delivery = WebhookDelivery.objects.get()
    assert (delivery.endpoint_id, delivery.tenant_id) == (ours.pk, acme.tenant.pk)
    assert delivery.dedupe_key.startswith(f"quarantine:{mine.pk}:")


def test_a_breaker_change_before_the_endpoint_existed_is_not_news(acme):
    Tenant.objects.filter(pk=acme.tenant.pk).update(
        breaker_state="DEGRADED", breaker_reason="certainty low", breaker_changed_at=timezone.now() - timedelta(days=1)
    )
    webhook_endpoint(acme.tenant, kinds=["breaker_change"])
    assert notifications_scan().created == 0
    Tenant.objects.filter(pk=acme.tenant.pk).update(breaker_state="NORMAL", breaker_changed_at=timezone.now())
    assert notifications_scan().created == 1
    assert WebhookDelivery.objects.get().body["fenceline"]["subject"]["state"] == "NORMAL"


def test_a_worker_quarantined_again_is_news_again(acme):
    from ledger.services.fleet.lifecycle import worker_quarantine, worker_resume

    webhook_endpoint(acme.tenant, kinds=["quarantine"])
    worker = worker_in(acme.tenant, "QUARANTINED", "w-again")
    assert notifications_scan().created == 1
    worker_resume(worker_id=worker.pk, reason="fixed", name="alice")
    worker_quarantine(worker_id=worker.pk, reason="again", name="alice")
    assert notifications_scan().created == 1
    assert WebhookDelivery.objects.count() == 2


def test_a_scan_is_bounded_per_kind_and_the_next_one_continues(acme):
    webhook_endpoint(acme.tenant, kinds=["quarantine"])
    for i in range(5):
        worker_in(acme.tenant, "QUARANTINED", f"w-{i}")
    assert notifications_scan(batch_size=2).created == 2
    assert notifications_scan(batch_size=2).created == 2
    assert notifications_scan(batch_size=2).created == 1
    assert notifications_scan(batch_size=2).created == 0


@pytest.mark.django_db(transaction=True)
def test_scans_at_once_insert_each_delivery_once(acme):
    webhook_endpoint(acme.tenant, kinds=["quarantine"])
    for i in range(10):
        worker_in(acme.tenant, "QUARANTINED", f"w-{i}")
    results = run_concurrently(lambda i: notifications_scan(), 4)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(r.created for r in results) == 10
    assert WebhookDelivery.objects.count() == 10
