"""Signing in as a person does in a browser: the login form, with a password the test sets."""

from playwright.sync_api import expect


def password_of(user) -> str:
    """Give ``user`` (of the cast, or built with tests/factories.py) a password: it is returned."""
    password = f"{user.username}-pass-1"
    user.set_password(password)
    user.save(update_fields=["password"])
    return password


def sign_in(page, live_server, user) -> None:
    """``user`` signs in through the login form and lands on the dashboard."""
    password = password_of(user)
    page.goto(live_server.url + "/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
