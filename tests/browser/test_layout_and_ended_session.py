"""Issue 40's console bugs in a real browser: a live page whose session has ended goes to the
sign-in page whole (never the sign-in page swapped into a card or a table); the pages fit the
window at 1400 px and on a 390 px phone (document.scrollWidth <= the viewport's width), with the
signed-in username visible on the phone. Screenshots in test-artifacts/browser/fit-*.png."""

import pytest
from django.contrib.sessions.models import Session
from playwright.sync_api import expect

from approvals.services.cases import case_escalate, case_resolve
from approvals.services.lookups import cases_look_up
from ledger.models import Tenant
from ledger.services.tenancy.roles import role_grant
from tests.browser.accounts import sign_in
from tests.factories import make_worker, pending_approvals, unknown_cases, unknown_payment
from tests.helpers import sandbox_charge

WIDTHS = (1400, 390)
PAGES = ("/", "/cases/?status=RESOLVED", "/cases/", "/approvals/", "/upgrades/", "/workers/")


def overflow(page) -> tuple[int, int]:
    """(document.scrollWidth, the viewport's width)."""
    return page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")


def tables_scrolling(page) -> list[int]:
    """How far each table in sight scrolls sideways inside its frame (0: it fits); a table
    inside a closed <details> is not in sight."""
    return page.evaluate(
        "() => [...document.querySelectorAll('.table-wrap')].filter(w => w.checkVisibility())"
        ".map(w => Math.max(0, w.scrollWidth - w.clientWidth))"
    )


@pytest.fixture
def busy(acme, admin, sandbox):
    """Two tenants with their breakers not NORMAL (one with a long name), open, escalated and
    resolved cases (one by a reconciler, with a long idempotency key), a pending approval; the
    admin has a role on both."""
    other = make_worker("northwind-logistics-emea", "nw-1")
    role_grant(username=admin.username, tenant=other.tenant, role="admin")
    cases = unknown_cases(acme.worker, 4)
    case_escalate(case_id=cases[1].pk, user=admin, reason="provider support ticket needed")
    for case in cases[2:]:
        case_resolve(
            case_id=case.pk,
            user=admin,
            resolution="DID_NOT_HAPPEN",
            reason="the provider's dashboard lists no charge with this idempotency key after the outage window",
        )
    key = "checkout-2026-12-06-customer-88123-order-55120-payment-attempt-3"
    unknown_payment(acme.worker, key)
    sandbox_charge(sandbox, key)
    assert cases_look_up().happened == 1
    pending_approvals(acme.worker)
    Tenant.objects.filter(slug="acme").update(breaker_state="DEGRADED")
    Tenant.objects.filter(pk=other.tenant.pk).update(breaker_state="THROTTLED")
    return admin


@pytest.mark.parametrize("width", WIDTHS)
def test_the_pages_fit_the_window_and_the_username_shows(live_server, page, screenshot, busy, width):
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server, busy)
    for path in PAGES:
        page.goto(live_server.url + path)
        expect(page.locator("main h1")).to_be_visible()
        name = path.strip("/").replace("/", "-").replace("?status=", "-") or "dashboard"
        screenshot(f"fit-{name}-{width}")
        scroll_width, viewport = overflow(page)
        assert scroll_width <= viewport, f"{path} is {scroll_width} px wide in a {viewport} px window"
        if width >= 1400:
            assert not any(tables_scrolling(page)), f"a table of {path} scrolls sideways at {width} px"
        expect(page.locator(".account").get_by_text(busy.username, exact=True)).to_be_visible()


def test_a_claim_after_the_session_ended_goes_to_the_sign_in_page_whole(live_server, page, acme, operator):
    unknown_cases(acme.worker, 1)
    sign_in(page, live_server, operator)
    page.goto(live_server.url + "/cases/")
    Session.objects.all().delete()  # signed out in another tab
    page.get_by_role("button", name="Claim").first.click()
    expect(page).to_have_url(live_server.url + "/accounts/login/?next=%2Fcases%2F")
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    expect(page.locator("#cases-table")).to_have_count(0)  # the whole page went, not a swap into the table


def test_a_poll_after_the_session_ended_goes_to_the_sign_in_page_whole(live_server, page, acme, operator):
    sign_in(page, live_server, operator)
    Session.objects.all().delete()
    page.evaluate("() => htmx.ajax('GET', '/', {target: '#counts', swap: 'outerHTML'})")  # the poll's request, now
    expect(page).to_have_url(live_server.url + "/accounts/login/?next=%2F")
    expect(page.locator("#counts")).to_have_count(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_opening_an_action_url_shows_the_console_page_saying_to_use_the_button(
    live_server, page, screenshot, acme, operator, width
):
    (case,) = unknown_cases(acme.worker, 1)
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server, operator)
    answer = page.goto(f"{live_server.url}/cases/{case.pk}/claim")
    assert answer is not None and answer.status == 405
    expect(page.get_by_role("heading", name="This address is an action")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    screenshot(f"fit-405-{width}")
    scroll_width, viewport = overflow(page)
    assert scroll_width <= viewport
