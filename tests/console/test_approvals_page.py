"""The approval queue page: what would happen, where, until when, under which policy
version, bound to which args digest and fencing token; decisions with a reason; expired
requests shown as EXPIRED and never approved; constant queries per page."""

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from ledger.models import Event, Operation
from tests.factories import pending_approvals, user_with
from tests.helpers import Browser, snapshot

URL = reverse("approvals")


def test_without_a_role_the_queue_shows_no_request_of_the_tenant(acme):
    pending_approvals(acme.worker)
    page = Browser(user_with(None, acme.tenant)).get(URL)
    assert page.status_code == 200
    assert "charge-0" not in page.content.decode()
    assert "No requests here." in page.content.decode()


def test_a_viewer_sees_what_where_until_when_and_the_binding_but_no_decision(acme, viewer):
    (approval,) = pending_approvals(acme.worker)
    body = Browser(viewer).get(URL).content.decode()
    op = Operation.objects.get(pk=approval.operation_id)
    for known in (
        "payments · charge",
        "customer:881",
        "charge-0",
        "sha256:abc123",
        f'<span class="mono">{approval.fencing_token}</span>',
        approval.expires_at.strftime("%Y-%m-%d %H:%M:%S"),
        f"v{op.decision_policy_version}",
        "PENDING",
    ):
        assert known in body, known
    assert reverse("approval-decide", args=[approval.pk]) not in body


def test_an_approver_sees_the_decision_form(acme, approver):
    (approval,) = pending_approvals(acme.worker)
    body = Browser(approver).get(URL).content.decode()
    assert reverse("approval-decide", args=[approval.pk]) in body


def test_another_tenants_requests_are_not_listed_and_deciding_them_is_404(acme, outsider, approver):
    (theirs,) = pending_approvals(outsider.worker)
    approver = Browser(approver)
    assert str(theirs.run_id)[:8] not in approver.get(URL).content.decode()
    before = snapshot()
    assert (
        approver.post(reverse("approval-decide", args=[theirs.pk]), {"decision": "approve", "reason": "x"}).status_code
        == 404
    )
    assert snapshot() == before


def test_an_approval_names_the_approver_and_reason_in_the_runs_chain(acme, approver):
    (approval,) = pending_approvals(acme.worker)
    browser = Browser(approver)
    response = browser.post(
        reverse("approval-decide", args=[approval.pk]),
        {"decision": "approve", "reason": "invoice 17 checked"},
        headers={"HX-Request": "true", "HX-Target": "approvals-table"},
    )
    assert response.status_code == 200
    assert response.content.decode().count('hx-swap-oob="beforeend:#toasts"') == 1
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.reason) == ("APPROVED", "alice", "invoice 17 checked")
    event = Event.objects.get(run_id=approval.run_id, type="APPROVAL_APPROVED")
    assert (event.actor, event.fields["reason"]) == ("user:alice", "invoice 17 checked")


def test_a_decision_without_a_reason_is_refused_and_changes_nothing(acme, approver):
    (approval,) = pending_approvals(acme.worker)
    browser = Browser(approver)
    before = snapshot()
    response = browser.post(reverse("approval-decide", args=[approval.pk]), {"decision": "approve", "reason": "  "})
    assert response.status_code == 422
    assert "reason: This field is required." in response.content.decode()
    assert snapshot() == before


def test_an_expired_request_is_shown_expired_and_a_late_yes_approves_nothing(acme, approver):
    (approval,) = pending_approvals(acme.worker)
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    browser = Browser(approver)
    body = browser.get(URL).content.decode()
    assert "EXPIRED" in body
    assert reverse("approval-decide", args=[approval.pk]) not in body
    response = browser.post(
        reverse("approval-decide", args=[approval.pk]), {"decision": "approve", "reason": "sorry, late"}
    )
    assert response.status_code == 409
    approval.refresh_from_db()
    assert approval.status == "EXPIRED"
    assert not Event.objects.filter(run_id=approval.run_id, type="APPROVAL_APPROVED").exists()
    assert "EXPIRED" in browser.get(f"{URL}?status=EXPIRED").content.decode()


def test_the_table_is_a_partial_polled_every_ten_seconds(acme, viewer):
    pending_approvals(acme.worker)
    browser = Browser(viewer)
    assert 'hx-trigger="every 10s' in browser.get(URL).content.decode()
    partial = browser.get(URL, headers={"HX-Request": "true", "HX-Target": "approvals-table"}).content.decode()
    assert partial.lstrip().startswith('<div id="approvals-table"') and "<html" not in partial


def queries_for(browser, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert browser.get(url).status_code == 200
    return len(captured)


def test_the_page_costs_the_same_queries_with_10_and_200_requests(acme, approver):
    browser = Browser(approver)
    pending_approvals(acme.worker, 10, prefix="a")
    browser.get(URL)  # the process's caches (content types) warm, as after any first request
    with_10 = queries_for(browser, URL)
    pending_approvals(acme.worker, 190, prefix="b")
    with_200 = queries_for(browser, URL)
    assert ApprovalRequest.objects.filter(status="PENDING").count() == 200
    assert with_10 == with_200


def test_a_request_without_an_args_digest_says_so_instead_of_a_dash(acme, viewer):
    (approval,) = pending_approvals(acme.worker)
    ApprovalRequest.objects.filter(pk=approval.pk).update(args_digest="")
    body = Browser(viewer).get(URL).content.decode()
    assert "attempt 1 (the worker sent no args digest)" in body
    assert '<span class="muted">args</span> <span class="mono break">—</span>' not in body
