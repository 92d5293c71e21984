"""Roles visible and runbooks in a real browser, at 1400 px and on a 390 px phone: the top bar
shows the username and a role badge per tenant; a viewer reads who may act and gets no
button; a case shows its runbook, folded, and opening it shows the tenant's guidance; the
settings page fits. Screenshots in test-artifacts/browser/roles-*.png."""

import pytest
from playwright.sync_api import expect

from ledger.services.tenancy.runbooks import runbook_set
from tests.browser.accounts import sign_in
from tests.factories import unknown_case

WIDTHS = (1400, 390)


def fits(page) -> bool:
    width, viewport = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    return width <= viewport


@pytest.mark.parametrize("width", WIDTHS)
def test_a_viewer_sees_their_role_who_may_act_and_the_runbook(
    live_server, page, screenshot, acme, admin, viewer, width
):
    unknown_case(acme.worker)
    runbook_set(
        tenant=acme.tenant,
        subject="reason",
        name="WORKER_REPORTED_UNKNOWN",
        text="Look the call up by its **idempotency key**.",
        reason="r",
        user=admin,
    )
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server, viewer)
    page.goto(live_server.url + "/cases/")
    account = page.locator(".account")
    expect(account.get_by_role("link", name="vera")).to_be_visible()
    expect(account.get_by_title("your role on tenant acme: viewer")).to_be_visible()
    expect(page.get_by_role("note")).to_contain_text("Operators and admins of acme may claim and resolve cases")
    expect(page.get_by_role("button", name="Claim")).to_have_count(0)
    page.get_by_text("for WORKER_REPORTED_UNKNOWN").click()
    expect(page.locator(".runbook-body strong")).to_have_text("idempotency key")
    screenshot(f"roles-cases-viewer-{width}")
    assert fits(page)

    page.locator(".account-name").click()
    expect(page.get_by_role("heading", name="Your settings")).to_be_visible()
    screenshot(f"roles-settings-viewer-{width}")
    assert fits(page)
