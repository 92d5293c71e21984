"""/activity/ and the lists' shared pager in a real browser: the feed fits the window at
1400 px and 390 px as an admin and as a viewer, a filter narrows it, a poll after the session
ended goes to the sign-in page whole; a list pages forward and back and a saved view comes
back. Screenshots in test-artifacts/browser/activity-*.png."""

import pytest
from django.contrib.sessions.models import Session
from playwright.sync_api import expect

from ledger.services.core.decisions import admin_action_record
from tests.browser.accounts import sign_in
from tests.factories import bulk_runs, new_run

WIDTHS = (1400, 390)


def overflow(page) -> tuple[int, int]:
    return page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_the_feed_fits_the_window_and_narrows_to_a_person(live_server, page, screenshot, acme, people, role, width):
    new_run(acme.worker)
    admin_action_record(
        tenant=acme.tenant,
        actor="user:ada",
        action="worker.drain",
        subject="worker-1",
        reason="host maintenance tonight",
    )
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server, people[role])
    page.goto(live_server.url + "/activity/")
    expect(page.get_by_role("heading", name="Activity")).to_be_visible()
    expect(page.locator("#activity-feed").get_by_text("RUN_CREATED")).to_be_visible()
    screenshot(f"activity-{role}-{width}")
    scroll_width, viewport = overflow(page)
    assert scroll_width <= viewport, f"/activity/ is {scroll_width} px wide in a {viewport} px window"

    page.locator("#activity-feed").get_by_role("link", name="user:ada").click()
    expect(page).to_have_url(live_server.url + "/activity/?who=user%3Aada")
    expect(page.locator("#activity-feed").get_by_text("host maintenance tonight")).to_be_visible()
    expect(page.locator("#activity-feed").get_by_text("RUN_CREATED")).to_have_count(0)


def test_a_bad_filter_is_shown_at_its_field(live_server, page, screenshot, acme, viewer):
    sign_in(page, live_server, viewer)
    answer = page.goto(live_server.url + "/activity/?type=DROP%20TABLE")
    assert answer is not None and answer.status == 400
    expect(page.get_by_role("alert").first).to_contain_text("type:")
    expect(page.locator("input[name=type]")).to_have_attribute("aria-invalid", "true")
    screenshot("activity-bad-filter")


def test_a_feed_poll_after_the_session_ended_goes_to_the_sign_in_page_whole(live_server, page, acme, viewer):
    sign_in(page, live_server, viewer)
    page.goto(live_server.url + "/activity/")
    Session.objects.all().delete()
    page.evaluate("() => htmx.ajax('GET', '/activity/', {target: '#activity-feed', swap: 'outerHTML'})")
    expect(page).to_have_url(live_server.url + "/accounts/login/?next=%2Factivity%2F")
    expect(page.locator("#activity-feed")).to_have_count(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_list_pages_back_and_a_saved_view_comes_back(live_server, page, screenshot, acme, viewer, width):
    bulk_runs(acme.tenant, 30)
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server, viewer)
    page.goto(live_server.url + "/runs/?size=25")
    first_run = page.locator("#runs-table tbody tr a.mono").first.inner_text()
    page.get_by_role("link", name="Next page (2) →").click()
    expect(page.get_by_text("Page 2 · 30 runs").first).to_be_visible()
    page.get_by_role("link", name="← Previous page").click()
    expect(page.locator("#runs-table tbody tr a.mono").first).to_have_text(first_run)
    expect(page.get_by_role("link", name="← Previous page")).to_have_count(0)

    page.get_by_text("Save this view").click()
    page.locator(".save-view input[name=name]").fill("Twenty-five a page")
    page.locator(".save-view").get_by_role("button", name="Save").click()
    page.goto(live_server.url + "/runs/")
    page.get_by_role("link", name="Twenty-five a page").click()
    expect(page).to_have_url(live_server.url + "/runs/?size=25")
    screenshot(f"activity-runs-saved-view-{width}")
    scroll_width, viewport = overflow(page)
    assert scroll_width <= viewport
