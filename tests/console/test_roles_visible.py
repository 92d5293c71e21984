"""Roles visible: the top bar names the user's role on each tenant; where a role hides a
page's actions, one line says which role may act; the settings page lists the roles."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from console.context_processors import role_line
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.tenants import tenant_ensure
from tests.factories import leased_run, pending_approvals, unknown_case, user_with
from tests.helpers import Browser

ACTION_PAGES = {
    "/cases/": ("Operators and admins of acme may claim and resolve cases", "Claim"),
    "/approvals/": ("Approvers and admins of acme may approve or deny requests", "Approve"),
    "/credentials/": ("Admins of acme may revoke and rotate credentials", "Revoke"),
    "/workers/": ("Admins of acme may drain and quarantine workers", "Drain"),
    "/runs/": ("Operators and admins of acme may cancel runs and verify their chains", None),
}


@pytest.fixture
def something_on_every_page(acme):
    unknown_case(acme.worker)
    pending_approvals(acme.worker)
    leased_run(acme.worker, owner="live")


def test_the_top_bar_shows_the_role_per_tenant(acme, operator):
    initech, _ = tenant_ensure(slug="initech", name="Initech")
    role_grant(username="olga", tenant=initech, role="viewer")
    body = Browser(operator).get(reverse("home")).content.decode()
    assert 'aria-label="Your roles"' in body
    assert 'title="your role on tenant acme: operator"' in body
    assert 'title="your role on tenant initech: viewer"' in body
    assert '<a class="account-name" href="/settings/"' in body


def test_a_user_without_a_role_is_told_so_in_the_top_bar(acme, outsider):
    body = Browser(user_with(None, acme.tenant, "nobody")).get(reverse("home")).content.decode()
    assert "no role yet" in body


@pytest.mark.parametrize("path", list(ACTION_PAGES))
def test_a_viewer_sees_who_may_act_and_no_action_buttons(acme, viewer, something_on_every_page, path):
    body = Browser(viewer).get(path).content.decode()
    line, button = ACTION_PAGES[path]
    assert f"{line} (you are viewer there)." in body
    if button:
        assert f">{button}" not in body


@pytest.mark.parametrize("path", ["/cases/", "/runs/"])
def test_an_operator_gets_no_line_where_they_may_act(acme, operator, something_on_every_page, path):
    assert 'class="role-line' not in Browser(operator).get(path).content.decode()


def test_an_approver_is_told_on_the_cases_page_and_not_on_the_approvals_page(acme, approver, something_on_every_page):
    browser = Browser(approver)
    assert "Operators and admins of acme may claim" in browser.get("/cases/").content.decode()
    assert 'class="role-line' not in browser.get("/approvals/").content.decode()


def test_the_line_names_only_the_tenants_where_the_role_hides_the_action(acme, operator):
    initech, _ = tenant_ensure(slug="initech", name="Initech")
    role_grant(username="olga", tenant=initech, role="viewer")
    body = Browser(operator).get("/cases/").content.decode()
    assert "Operators and admins of initech may claim and resolve cases (you are viewer there)." in body


def test_the_line_never_names_a_tenant_the_user_has_no_role_on(acme, outsider, viewer):
    body = Browser(viewer).get("/cases/").content.decode()
    assert "globex" not in body


def test_no_line_on_a_page_without_role_bound_actions():
    assert role_line("/tenants/", []) == ""


def test_the_settings_page_lists_the_roles_and_needs_a_sign_in(acme, approver, client):
    assert client.get(reverse("my-settings")).status_code == 302
    body = Browser(approver).get(reverse("my-settings")).content.decode()
    assert "approve or deny approval requests" in body and ">acme</a>" in body


@pytest.mark.parametrize("path", [p for p, (_, button) in ACTION_PAGES.items() if button])
def test_an_admin_sees_the_buttons_and_no_line(acme, admin, something_on_every_page, path):
    body = Browser(admin).get(path).content.decode()
    assert 'class="role-line' not in body
    assert f">{ACTION_PAGES[path][1]}" in body


def test_a_superuser_is_shown_as_such_and_told_nothing(acme, something_on_every_page):
    root = get_user_model().objects.create_superuser("root", "root@example.com", "x")
    body = Browser(root).get("/cases/").content.decode()
    assert ">superuser</span>" in body and 'class="role-line' not in body
