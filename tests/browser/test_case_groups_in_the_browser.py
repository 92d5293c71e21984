"""Case groups in a real browser: an operator claims a group of similar cases, then resolves
them all with one verdict and evidence, each time after the exact preview; the groups panel
and the table are swapped by htmx with one toast."""

from playwright.sync_api import expect

from approvals.models import ReconciliationCase
from tests.browser.accounts import sign_in
from tests.factories import unknown_cases


def test_an_operator_claims_then_resolves_a_group_of_similar_cases(live_server, page, screenshot, acme, operator):
    cases = unknown_cases(acme.worker, 3)
    sign_in(page, live_server, operator)
    page.goto(live_server.url + "/cases/")
    groups = page.locator("#similar-cases")
    expect(groups).to_contain_text("3")
    expect(page.locator(f"#case-{cases[0].pk}")).to_contain_text("escalates in")

    groups.locator("summary", has_text="Act on these 3").click()
    groups.locator("select[name=action]").select_option("claim")
    groups.get_by_role("button", name="Preview").click()
    preview = page.locator(".bulk-preview")
    expect(preview).to_contain_text("Group claim: 3 cases will be claimed by you")
    screenshot("case_group_preview")
    preview.get_by_role("button", name="Claim these 3 cases").click()
    expect(page.locator("#toasts")).to_contain_text("3 cases claimed")
    expect(page.locator(f"#case-{cases[0].pk}")).to_contain_text("claim expires in")

    groups = page.locator("#similar-cases")
    groups.locator("summary", has_text="Act on these 3").click()
    groups.locator("select[name=action]").select_option("resolve")
    groups.get_by_label("Why · evidence").fill("provider outage 10:00-10:20, nothing was sent")
    groups.get_by_role("button", name="Preview").click()
    expect(page.locator(".bulk-preview")).to_contain_text("Group resolve: 3 cases will be resolved as DID_NOT_HAPPEN")
    page.locator(".bulk-preview").get_by_role("button", name="Resolve these 3 cases").click()
    expect(page.locator("#toasts")).to_contain_text("3 cases resolved as DID_NOT_HAPPEN")
    assert set(ReconciliationCase.objects.values_list("status", "resolved_by")) == {("RESOLVED", "olga")}
    expect(page.locator("#similar-cases")).to_contain_text("No two cases waiting for people are alike")
