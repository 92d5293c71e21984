"""A person signs in to the console in a real browser, at desktop and phone widths."""

import pytest
from playwright.sync_api import expect

from ledger.services.tenancy.roles import role_grant


@pytest.fixture
def viewer(acme):
    role_grant(username="vera", tenant=acme.tenant, role="viewer", password="vera-pass-1")
    return "vera", "vera-pass-1"


@pytest.mark.parametrize("width", [1280, 390])
def test_a_viewer_signs_in_and_lands_on_the_dashboard(live_server, page, screenshot, viewer, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(live_server.url + "/")
    expect(page).to_have_url(live_server.url + "/accounts/login/?next=/")
    screenshot(f"sign_in_{width}")
    page.get_by_label("Username").fill(viewer[0])
    page.get_by_label("Password").fill(viewer[1])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    screenshot(f"dashboard_{width}")


def test_a_wrong_password_is_refused_with_a_message(live_server, page, viewer):
    page.goto(live_server.url + "/accounts/login/")
    page.get_by_label("Username").fill(viewer[0])
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("did not match")
