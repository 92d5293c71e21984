"""Triage as an on-call operator does it (issue 17), in a real browser: a run page that
shows new events and a phase change without a reload, claim → resolve and approve from
the keyboard, a bulk approval behind its exact preview, filters whose bad values say so,
and the cases queue at a phone's width."""

from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ReconciliationCase
from approvals.services.cases import case_claim, case_resolve
from ledger.services.fence import notes, runs
from tests.browser.accounts import sign_in
from tests.factories import leased_run, pending_approvals, unknown_cases, user_with


def test_the_run_page_shows_new_events_and_its_end_without_a_reload(live_server, page, screenshot, acme, viewer):
    run, token = leased_run(acme.worker, ttl_s=600)
    notes.event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"step": 1})
    sign_in(page, live_server, viewer)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#run-status")).to_contain_text("ACTIVE")
    expect(page.locator(".new-events")).to_have_count(0)

    for step in (2, 3):
        notes.event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"step": step})
    runs.run_complete(worker=acme.worker, run_id=run.pk, fencing_token=token)
    # The page polls every 5 s: the marker and the new status arrive by themselves.
    marker = page.locator(".new-events")
    expect(marker).to_contain_text("new events since you opened this page")
    expect(page.locator("#run-status")).to_contain_text("COMPLETED")
    expect(page.locator("#run-indicators")).to_be_visible()
    screenshot("run-live-new-events")

    marker.get_by_role("link", name="Show them").click()
    expect(page.locator("table.timeline")).to_contain_text("RUN_COMPLETED")


def test_claim_and_resolve_from_the_keyboard(live_server, page, screenshot, acme, operator):
    first, second = unknown_cases(acme.worker, 2)
    sign_in(page, live_server, operator)
    page.goto(live_server.url + "/cases/?sort=oldest")
    page.keyboard.press("j")
    expect(page.locator(f"#case-{first.pk}")).to_be_focused()
    page.keyboard.press("c")
    expect(page.locator("#toasts")).to_contain_text("claimed")
    expect(page.locator(f"#case-{first.pk}")).to_contain_text("by olga")
    assert ReconciliationCase.objects.get(pk=first.pk).claimed_by == "olga"

    page.locator(f"#case-{first.pk}").focus()  # the swapped table: focus the row again, as j would
    page.keyboard.press("r")
    reason = page.locator(f"#case-{first.pk}").get_by_label("Resolution reason")
    expect(reason).to_be_focused()
    page.locator(f"#case-{first.pk} select[name=resolution]").select_option("DID_NOT_HAPPEN")
    reason.fill("the provider's log has no such request")
    screenshot("cases-keyboard-resolve")
    reason.press("Enter")
    expect(page.locator("#toasts")).to_contain_text("resolved as DID_NOT_HAPPEN")
    assert ReconciliationCase.objects.get(pk=first.pk).status == "RESOLVED"
    assert ReconciliationCase.objects.get(pk=second.pk).status == "OPEN"

    page.keyboard.press("?")
    expect(page.locator("#keys-help")).to_be_visible()
    screenshot("keyboard-help")
    page.keyboard.press("Escape")
    expect(page.locator("#keys-help")).to_be_hidden()


def test_approve_from_the_keyboard_sends_nothing_before_enter(live_server, page, acme, approver):
    (approval,) = pending_approvals(acme.worker)
    sign_in(page, live_server, approver)
    page.goto(live_server.url + "/approvals/")
    page.keyboard.press("j")
    page.keyboard.press("a")
    reason = page.locator(f"#approval-{approval.pk}").locator("input[name=reason]")
    expect(reason).to_be_focused()
    reason.fill("invoice 17 checked")
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "PENDING"  # nothing sent yet
    reason.press("Enter")
    expect(page.locator("#toasts")).to_contain_text("approved")
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.reason) == ("APPROVED", "alice", "invoice 17 checked")


def test_bulk_approve_shows_exactly_what_it_will_approve(live_server, page, screenshot, acme, approver):
    requests = pending_approvals(acme.worker, 3)
    sign_in(page, live_server, approver)
    page.goto(live_server.url + "/approvals/")
    for approval in requests[:2]:
        page.locator(f"#approval-{approval.pk} input[type=checkbox]").check()
    bulk = page.locator("#bulk-approvals")
    bulk.get_by_label("Reason").fill("the March invoices, checked together")
    bulk.get_by_role("button", name="Preview").click()
    preview = page.locator(".bulk-preview")
    expect(preview).to_contain_text("2 requests will be approved")
    for approval in requests[:2]:
        expect(preview).to_contain_text(str(approval.pk))
    expect(preview).not_to_contain_text(str(requests[2].pk))
    screenshot("approvals-bulk-preview")
    assert set(ApprovalRequest.objects.values_list("status", flat=True)) == {"PENDING"}  # a preview changes nothing
    preview.get_by_role("button", name="Approve these 2 requests").click()
    expect(page.locator("#toasts")).to_contain_text("2 requests approved")
    statuses = dict(ApprovalRequest.objects.values_list("pk", "status"))
    assert [statuses[a.pk] for a in requests] == ["APPROVED", "APPROVED", "PENDING"]


def test_bad_filter_values_say_so_on_every_list(live_server, page, screenshot, acme, viewer):
    unknown_cases(acme.worker, 1)
    sign_in(page, live_server, viewer)
    for path, says in (
        ("/cases/?status=closed-ish", "There is no status “closed-ish”: showing open instead."),
        ("/approvals/?status=maybe", "There is no status “maybe”"),
        ("/runs/?phase=sideways", "There is no phase “sideways”"),
        ("/credentials/?state=gone", "There is no state “gone”: showing active instead."),
    ):
        page.goto(live_server.url + path)
        expect(page.locator(".notice").first).to_contain_text(says)
    screenshot("filters-bad-value")
    page.goto(live_server.url + "/approvals/?status=APPROVED")
    expect(page.locator(".notice")).to_have_count(0)
    expect(page.locator("select[name=status]")).to_have_value("APPROVED")


def test_the_cases_queue_stacks_at_a_phones_width_and_keeps_who_has_it(live_server, page, screenshot, acme, operator):
    cases = unknown_cases(acme.worker, 3)
    case_claim(case_id=cases[0].pk, user=user_with("operator", acme.tenant, "pat"))
    sign_in(page, live_server, operator)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(live_server.url + "/cases/")
    row = page.locator(f"#case-{cases[0].pk}")
    expect(row.locator(".claimed-by")).to_be_visible()
    expect(row.locator(".claimed-by")).to_contain_text("by pat")
    assert row.locator("td").first.evaluate("td => getComputedStyle(td).display") == "block"
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at 390px"
    screenshot("cases-390px")


def test_the_resolved_list_fits_a_laptop_screen(live_server, page, screenshot, acme, operator):
    cases = unknown_cases(acme.worker, 3)
    for case in cases:
        case_resolve(case_id=case.pk, user=operator, resolution="COMPENSATED", reason="refunded by hand, ticket 4411")
    sign_in(page, live_server, user_with("operator", acme.tenant, "rita"))
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(live_server.url + "/cases/?status=resolved")
    expect(page.locator(f"#case-{cases[0].pk}")).to_contain_text("by olga")
    expect(page.locator("#bulk-form")).to_have_count(0)  # nothing selectable, no bulk panel
    wrap = page.locator("#cases-table .table-wrap")
    sideways = wrap.evaluate("w => w.scrollWidth - w.clientWidth")
    assert sideways <= 0, f"the resolved table overflows by {sideways}px at 1400px"
    screenshot("cases-resolved-1400px")
