"""An upgrade window in a real browser: the run page says its automation stopped on a state
conflict; an operator decides the conflict on the upgrades page with a reason, and the
worker's next fenced call over the API goes through; an admin allows effects after a
restore."""

from playwright.sync_api import expect

from ledger.models import RunLease, Tenant
from ledger.services.upgrades.restore import effects_hold
from tests.browser.accounts import sign_in
from tests.factories import booted, state_conflict


def test_an_operator_decides_a_state_conflict_and_the_run_goes_on(
    live_server, page, screenshot, acme, api_for, operator
):
    booted(acme.worker, reads=2)
    conflict = state_conflict(acme)
    token = RunLease.objects.get(run_id=conflict.run_id).fencing_token
    worker = api_for(acme)
    refused = worker.post(f"/runs/{conflict.run_id}/events", {"fencing_token": token, "type": "NOTE", "fields": {}})
    assert (refused.status, refused.body["error"]) == (409, "STATE_CONFLICT")

    sign_in(page, live_server, operator)
    page.goto(f"{live_server.url}/runs/{conflict.run_id}/")
    expect(page.locator(".conflict-banner")).to_contain_text("automation stopped")
    screenshot("upgrades_run_conflict_banner")
    page.locator(".conflict-banner").get_by_role("link", name="upgrades page").click()
    row = page.locator(f"#conflict-{conflict.pk}")
    expect(row).to_contain_text("ch_2")
    expect(row).to_contain_text("ch_1")
    screenshot("upgrades_page_conflict")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the table stacks, the form stays whole
    expect(row.get_by_role("button", name="Decide")).to_be_visible()
    expect(row.get_by_label("new (provider_ref)")).to_be_visible()
    screenshot("upgrades_page_390px")
    page.set_viewport_size({"width": 1280, "height": 800})
    row.get_by_label("new (provider_ref)").check()
    row.get_by_label(f"Why for conflict {conflict.pk}").fill("the provider's dashboard shows ch_1")
    row.get_by_role("button", name="Decide").click()
    expect(page.locator("#toasts")).to_contain_text("provider_ref kept")
    expect(page.locator(f"#conflict-{conflict.pk}")).to_have_count(0)
    screenshot("upgrades_page_decided")

    allowed = worker.post(f"/runs/{conflict.run_id}/events", {"fencing_token": token, "type": "NOTE", "fields": {}})
    assert allowed.status == 201, allowed.body


def test_an_admin_allows_effects_after_a_restore(live_server, page, screenshot, acme, admin):
    effects_hold(by="restore_check", tenants=["acme"], reason="restored from the 02:00 backup")
    sign_in(page, live_server, admin)
    page.goto(f"{live_server.url}/tenants/acme/")
    expect(page.locator("main")).to_contain_text("effects held")
    page.get_by_role("link", name="upgrades page").click()
    row = page.locator("#held-acme")
    expect(row).to_contain_text("restored from the 02:00 backup")
    screenshot("upgrades_effects_held")
    row.get_by_label("Why allow effects for acme").fill("chains verified; two UNKNOWN effects checked at the provider")
    row.get_by_role("button", name="Allow effects").click()
    expect(page.locator("#toasts")).to_contain_text("Effects allowed for acme")
    assert not Tenant.objects.get(slug="acme").effects_held
