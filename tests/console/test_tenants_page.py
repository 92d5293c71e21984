"""The tenant pages: the starter-policy mark, policy versions and change, budgets and
breaker, roles and grant, admin decisions; the three permission tests; constant queries."""

import json

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.models import TenantPolicy
from ledger.roles import VIEW, can
from ledger.services.authority.policy import policy_change
from ledger.services.tenancy.tenants import tenant_ensure
from tests.factories import dispatched_operation, leased_run, set_policy, user_with
from tests.helpers import Browser

URL = reverse("tenants")


def detail(slug="acme"):
    return reverse("tenant_detail", args=[slug])


def queries_for(browser, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert browser.get(url).status_code == 200
    return len(captured)


def test_without_a_role_no_tenant_is_listed_and_its_page_is_404(acme):
    browser = Browser(user_with(None, acme.tenant))
    assert browser.get(URL).context["rows"] == []
    assert browser.get(detail()).status_code == 404


def test_a_viewer_reads_the_policy_and_roles_but_gets_no_form(acme, viewer):
    browser = Browser(viewer)
    page = browser.get(detail())
    body = page.content.decode()
    assert page.status_code == 200 and "starter policy" in body and "vera" in body
    assert "Save as version" not in body and "Grant a role" not in body
    assert (
        browser.post(
            reverse("tenant-grant", args=["acme"]), {"username": "x", "role": "admin", "reason": "r"}
        ).status_code
        == 403
    )


def test_another_tenant_is_not_listed_and_its_page_and_actions_are_404(acme, outsider, admin):
    browser = Browser(admin)
    assert [t.slug for t in browser.get(URL).context["rows"]] == ["acme"]
    assert browser.get(detail("globex")).status_code == 404
    assert browser.post(reverse("tenant-policy", args=["globex"]), {"document": "{}", "reason": "r"}).status_code == 404


def test_tenants_still_on_the_starter_policy_are_marked(acme, outsider, admin):
    policy_change(tenant=acme.tenant, document={"human_approval_tools": ["payments"]}, changed_by="t", reason="r")
    from ledger.services.tenancy.roles import role_grant

    role_grant(username=admin.username, tenant=outsider.tenant, role="viewer")
    rows = {t.slug: t for t in Browser(admin).get(URL).context["rows"]}
    body = Browser(admin).get(URL).content.decode()
    assert rows["acme"].policy_version == 2 and rows["globex"].policy_version == 1
    assert body.count("starter policy</span>") == 1
    assert "starter policy" in Browser(admin).get(reverse("home")).content.decode()


def test_a_policy_change_from_the_console_is_a_new_version_naming_its_author(acme, admin):
    browser = Browser(admin)
    document = {"human_approval_tools": ["payments"], "max_ttl_s": 600}
    assert (
        browser.post(
            reverse("tenant-policy", args=["acme"]), {"document": json.dumps(document), "reason": "tighter"}
        ).status_code
        == 302
    )
    row = TenantPolicy.objects.get(tenant=acme.tenant, version=2)
    assert (row.created_by, row.reason, row.document["max_ttl_s"]) == ("ada", "tighter", 600)


def test_a_bad_policy_is_refused_with_its_reason_and_the_draft_kept(acme, admin):
    browser = Browser(admin)
    bad = browser.post(reverse("tenant-policy", args=["acme"]), {"document": '{"max_ttl_s": ', "reason": "r"})
    assert bad.status_code == 422 and "not valid JSON" in bad.content.decode()
    assert bad.context["draft"] == '{"max_ttl_s": '  # the draft is kept in the form, escaped in the page
    wrong = browser.post(reverse("tenant-policy", args=["acme"]), {"document": '{"no_such_key": 1}', "reason": "r"})
    assert wrong.status_code == 422
    assert TenantPolicy.objects.filter(tenant=acme.tenant).count() == 1


def test_granting_a_role_creates_the_user_with_exactly_that_role(acme, django_user_model, admin):
    browser = Browser(admin)
    data = {"username": "newbie", "role": "operator", "reason": "on call this week", "password": "newbie-pass-1"}
    assert browser.post(reverse("tenant-grant", args=["acme"]), data).status_code == 302
    newbie = django_user_model.objects.get(username="newbie")
    assert newbie.check_password("newbie-pass-1")
    assert can(newbie, acme.tenant, VIEW) and {
        r["role"] for r in browser.get(detail()).context["roles"] if r["user"] == newbie
    } == {"operator"}
    page = browser.get(detail()).content.decode()
    assert "newbie-pass-1" not in page and "on call this week" in page
    own = browser.post(reverse("tenant-grant", args=["acme"]), {"username": "ada", "role": "viewer", "reason": "oops"})
    assert own.status_code == 422


def test_the_pages_cost_the_same_queries_with_10_and_200_rows(acme, admin):
    browser = Browser(admin)
    from ledger.services.tenancy.roles import role_grant

    def grow(n, prefix):
        for i in range(n):
            tenant, _ = tenant_ensure(slug=f"{prefix}-{i}")
            role_grant(username=admin.username, tenant=tenant, role="viewer")
            policy_change(
                tenant=acme.tenant, document={"max_ttl_s": 600 + i}, user=admin, reason=f"change {prefix} {i}"
            )
            role_grant(username=f"{prefix}-user-{i}", tenant=acme.tenant, role="viewer", user=admin, reason="team")

    grow(10, "a")
    with_10 = (queries_for(browser, URL), queries_for(browser, detail()))
    grow(190, "b")
    with_200 = (queries_for(browser, URL), queries_for(browser, detail()))
    assert with_10 == with_200


def test_the_tenant_page_shows_the_flow_limits_and_their_use(acme, viewer):
    set_policy(
        acme.tenant,
        concurrency={"tool:email": 3, "key:*": 1},
        rate_limits={"tenant": {"per_s": 0.001, "burst": 4}},
    )
    run, token = leased_run(acme.worker)
    dispatched_operation(acme.worker, run, token, "flow-1")

    page = Browser(viewer).get(detail())

    rows = {row["key"]: row for row in page.context["flow_limits"]}
    assert rows["tool:email"]["use"] == "1 of 3 held"
    assert rows["key:*"]["use"] == "0 held over 0 flow keys (each up to 1)"
    assert rows["tenant"]["limit"] == "0.001/s, burst 4" and "1 given" in rows["tenant"]["use"]
    body = page.content.decode()
    assert "Flow control at dispatch" in body and "1 of 3 held" in body
