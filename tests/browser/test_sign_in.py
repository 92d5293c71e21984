"""A person signs in to the console in a real browser, at desktop and phone widths."""

import pytest
from playwright.sync_api import expect

from tests.browser.accounts import password_of


@pytest.fixture
def viewer_login(viewer):
    """The cast's viewer with a password: (username, password)."""
    return viewer.username, password_of(viewer)


@pytest.mark.parametrize("width", [1280, 390])
def test_a_viewer_signs_in_and_lands_on_the_dashboard(live_server, page, screenshot, viewer_login, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(live_server.url + "/")
    expect(page).to_have_url(live_server.url + "/accounts/login/?next=/")
    screenshot(f"sign_in_{width}")
    page.get_by_label("Username").fill(viewer_login[0])
    page.get_by_label("Password").fill(viewer_login[1])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    screenshot(f"dashboard_{width}")


def test_a_wrong_password_is_refused_with_a_message(live_server, page, viewer_login):
    page.goto(live_server.url + "/accounts/login/")
    page.get_by_label("Username").fill(viewer_login[0])
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("did not match")
