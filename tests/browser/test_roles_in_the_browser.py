"""What people see and may do, in a real browser: an approver's decision lets the worker's
next call proceed over the API; a viewer sees no action buttons and a forged POST is refused."""

from playwright.sync_api import expect

from approvals.models import ReconciliationCase
from tests.browser.accounts import sign_in
from tests.factories import pending_approvals, unknown_cases


def test_an_approval_in_the_console_lets_the_workers_next_call_proceed(
    live_server, page, screenshot, acme, api_for, approver
):
    (approval,) = pending_approvals(acme.worker)
    worker = api_for(acme)
    op_id = str(approval.operation_id)
    waiting = worker.post(f"/operations/{op_id}/authorize", {"fencing_token": approval.fencing_token})
    assert waiting.status == 202 and waiting.body["approval_id"] == str(approval.pk)

    sign_in(page, live_server, approver)
    page.goto(live_server.url + "/approvals/")
    row = page.locator(f"#approval-{approval.pk}")
    row.get_by_label("Reason").fill("customer confirmed the charge by phone")
    row.get_by_role("button", name="Approve").click()
    expect(page.locator("#toasts")).to_contain_text("approved")
    screenshot("approver_approved")

    allowed = worker.post(f"/operations/{op_id}/authorize", {"fencing_token": approval.fencing_token})
    assert allowed.body == {"decision": "ALLOW", "phase": "AUTHORIZED"}
    assert worker.dispatch(op_id, approval.fencing_token).body == {
        "phase": "DISPATCHED",
        "reservation_id": None,
        "levers": None,
    }
    assert worker.get(f"/approvals/{approval.pk}").body["status"] == "USED"


def test_a_viewer_sees_no_action_buttons_and_a_forged_post_is_refused(live_server, page, screenshot, acme, viewer):
    (case,) = unknown_cases(acme.worker, 1)
    sign_in(page, live_server, viewer)
    page.goto(live_server.url + "/cases/")
    row = page.locator(f"#case-{case.pk}")
    expect(row).to_contain_text("OPEN")
    expect(row.get_by_role("button")).to_have_count(0)
    expect(page.get_by_role("button", name="Preview")).to_have_count(0)
    screenshot("viewer_cases")

    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    forged = page.request.post(
        f"{live_server.url}/cases/{case.pk}/claim",
        headers={"X-CSRFToken": token, "Referer": live_server.url + "/cases/"},
    )
    assert forged.status == 403
    assert ReconciliationCase.objects.get(pk=case.pk).status == "OPEN"
