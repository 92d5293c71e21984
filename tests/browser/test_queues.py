"""The decision queues in a real browser: htmx actions post with the CSRF header, swap the
live table and show one toast; bulk resolve previews exactly the selected cases first."""

from playwright.sync_api import expect

from approvals.models import ReconciliationCase
from tests.browser.accounts import sign_in
from tests.factories import pending_approvals, unknown_cases


def test_an_operator_claims_resolves_and_bulk_resolves_cases(live_server, page, screenshot, acme, operator):
    cases = unknown_cases(acme.worker, 4)
    sign_in(page, live_server, operator)
    page.goto(live_server.url + "/cases/")
    first = page.locator(f"#case-{cases[0].pk}")
    first.get_by_role("button", name="Claim").click()
    expect(page.locator("#toasts")).to_contain_text("claimed")
    expect(page.locator(f"#case-{cases[0].pk}")).to_contain_text("by olga")
    screenshot("cases_claimed")

    row = page.locator(f"#case-{cases[0].pk}")
    row.locator("summary", has_text="Resolve").click()
    row.locator("select[name=resolution]").select_option("HAPPENED")
    row.get_by_label("Resolution reason").fill("found it in the provider console")
    row.get_by_role("button", name="Resolve").click()
    expect(page.locator("#toasts")).to_contain_text("provider")  # HAPPENED needs the provider id
    assert ReconciliationCase.objects.get(pk=cases[0].pk).status == "CLAIMED"
    row.get_by_label("Provider request id").fill("gh-issue-991")
    row.get_by_role("button", name="Resolve").click()
    expect(page.locator("#toasts")).to_contain_text("resolved as HAPPENED")
    expect(page.locator(f"#case-{cases[0].pk}")).to_have_count(0)

    for case in cases[1:3]:
        page.locator(f"#case-{case.pk} input[type=checkbox]").check()
    bulk = page.locator("#bulk-form")
    bulk.locator("select[name=resolution]").select_option("DID_NOT_HAPPEN")
    bulk.get_by_label("Reason").fill("provider outage, nothing was sent")
    bulk.get_by_role("button", name="Preview").click()
    preview = page.locator(".bulk-preview")
    expect(preview).to_contain_text("2 cases will be resolved")
    for case in cases[1:3]:
        expect(preview).to_contain_text(str(case.pk))
    expect(preview).not_to_contain_text(str(cases[3].pk))
    screenshot("cases_bulk_preview")
    preview.get_by_role("button", name="Resolve these 2").click()
    expect(page.locator("#toasts")).to_contain_text("2 cases resolved")
    statuses = dict(ReconciliationCase.objects.values_list("pk", "status"))
    assert [statuses[c.pk] for c in cases] == ["RESOLVED", "RESOLVED", "RESOLVED", "OPEN"]


def test_an_approver_approves_with_a_reason(live_server, page, screenshot, acme, approver):
    (approval,) = pending_approvals(acme.worker)
    sign_in(page, live_server, approver)
    page.goto(live_server.url + "/approvals/")
    row = page.locator(f"#approval-{approval.pk}")
    expect(row).to_contain_text("sha256:abc123")
    row.get_by_label("Reason").fill("invoice 17 checked")
    screenshot("approvals_decide")
    row.get_by_role("button", name="Approve").click()
    expect(page.locator("#toasts")).to_contain_text("approved")
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("APPROVED", "alice")
