"""The run page's fixes for admins (issue 40): force-release a lease and retry an operation,
each previewed (a page, or its fragment for htmx) before a POST with a reason does it. The
three permission tests for each (another role: 403; another tenant's run: 404; the admin:
200), what the preview shows, and what the confirmation does."""

import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest
from ledger.models import Operation, RunLease
from ledger.services.fence import leases, outcomes
from ledger.states import Phase
from tests.factories import dispatched_operation, expire, leased_run, new_run
from tests.helpers import events_of, logged_in


def release_url(run) -> str:
    return reverse("run-force-release", args=[run.pk])


def retry_url(run, op) -> str:
    return reverse("operation-retry", args=[run.pk, op.pk])


def failed_op(acme, effect_class="IDEMPOTENT"):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "send-1", effect_class)
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="FAILED")
    return run, op


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_other_roles_get_403_for_both_fixes(acme, people, role):
    run, op = failed_op(acme)
    client = logged_in(people[role])
    for url in (release_url(run), retry_url(run, op)):
        assert client.get(url).status_code == 403
        assert client.post(url, {"reason": "x", "fencing_token": 1}).status_code == 403
    assert RunLease.objects.get(run=run).owner_id is not None
    assert Operation.objects.get(pk=op.pk).phase == Phase.FAILED


def test_another_tenants_run_is_404(acme, outsider_admin):
    run, op = failed_op(acme)
    client = logged_in(outsider_admin)
    assert client.get(release_url(run)).status_code == 404
    assert client.get(retry_url(run, op)).status_code == 404
    assert client.post(release_url(run), {"reason": "x", "fencing_token": 1}).status_code == 404


def test_the_force_release_preview_shows_the_holder_and_what_becomes_unknown(acme, admin):
    run, token = leased_run(acme.worker, owner="owner-a")
    dispatched_operation(acme.worker, run, token, "in-flight-1")
    page = logged_in(admin).get(release_url(run))
    body = page.content.decode()
    assert page.status_code == 200
    assert "owner-a" in body and f"Force-release token {token}" in body and "in-flight-1" in body
    assert f'name="fencing_token" value="{token}"' in body
    fragment = logged_in(admin).get(release_url(run), HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200 and "<html" not in fragment.content.decode()
    assert 'id="force-release-preview"' in fragment.content.decode()
    assert RunLease.objects.get(run=run).owner_id == "owner-a"  # a preview changes nothing


def test_confirming_the_force_release_ends_the_lease_with_the_admins_reason(acme, admin):
    run, token = leased_run(acme.worker, owner="owner-a")
    op = dispatched_operation(acme.worker, run, token, "in-flight-1")
    answer = logged_in(admin).post(release_url(run), {"reason": "worker wedged", "fencing_token": token})
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{run.pk}/"
    assert RunLease.objects.get(run=run).owner_id is None
    assert Operation.objects.get(pk=op.pk).phase == Phase.UNKNOWN
    (revoked,) = events_of(run, "LEASE_REVOKED")
    assert revoked.actor == "user:ada" and "worker wedged" in revoked.fields["reason"]


def test_a_force_release_without_a_reason_is_refused_naming_the_field(acme, admin):
    run, token = leased_run(acme.worker)
    answer = logged_in(admin).post(release_url(run), {"reason": "", "fencing_token": token})
    assert answer.status_code == 422 and "reason" in answer.content.decode()
    assert RunLease.objects.get(run=run).owner_id is not None


def test_a_stale_preview_is_refused_and_shows_the_lease_now(acme, admin):
    run, token = leased_run(acme.worker, owner="owner-a")
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=60)
    answer = logged_in(admin).post(release_url(run), {"reason": "old preview", "fencing_token": token})
    body = answer.content.decode()
    assert answer.status_code == 409 and "the one the preview showed" in body and "owner-b" in body
    assert RunLease.objects.get(run=run).owner_id == "owner-b"


def test_a_lease_nobody_holds_has_nothing_to_release(acme, admin):
    page = logged_in(admin).get(release_url(new_run(acme.worker)))
    assert page.status_code == 200 and "Nothing to release" in page.content.decode()


def test_the_retry_preview_and_confirmation(acme, admin):
    run, op = failed_op(acme)
    client = logged_in(admin)
    body = client.get(retry_url(run, op)).content.decode()
    assert "RETRY_SAME_KEY" in body and "Retry as attempt 2" in body
    answer = client.post(retry_url(run, op), {"reason": "provider is back"})
    assert answer.status_code == 302
    assert Operation.objects.get(pk=op.pk).attempt == 2


def test_a_non_retryable_retry_asks_for_approval(acme, admin):
    run, op = failed_op(acme, "NON_RETRYABLE")
    client = logged_in(admin)
    body = client.get(retry_url(run, op)).content.decode()
    assert "APPROVAL" in body and "Ask for approval to retry" in body
    answer = client.post(retry_url(run, op), {"reason": "customer asked"})
    assert answer.status_code == 302
    assert ApprovalRequest.objects.get(operation=op).kind == "RETRY"
    assert Operation.objects.get(pk=op.pk).phase == Phase.FAILED


def test_a_retry_the_decision_refuses_says_why_and_offers_no_button(acme, admin):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "unknown-1", "IDEMPOTENT")
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
    body = logged_in(admin).get(retry_url(run, op)).content.decode()
    assert "Not possible" in body and "RECONCILE" in body and "Retry as attempt" not in body


def test_the_run_page_offers_the_fixes_to_admins_only(acme, admin, operator):
    run, op = failed_op(acme)
    url = reverse("run_detail", args=[run.pk])
    as_admin = logged_in(admin).get(url).content.decode()
    assert release_url(run) in as_admin and retry_url(run, op) in as_admin
    as_operator = logged_in(operator).get(url).content.decode()
    assert release_url(run) not in as_operator and retry_url(run, op) not in as_operator
