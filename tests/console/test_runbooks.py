"""Runbooks: a tenant's admins write Markdown guidance per case reason and per reconciler
verdict on the tenant page; it shows, sanitised, on every case it applies to. The three
permission tests, the sanitiser's canaries, the secret boundary, the service's refusals."""

from html.parser import HTMLParser

import pytest
from django.urls import reverse

from approvals.models import ReconciliationCase
from ledger.errors import Forbidden, ForbiddenField
from ledger.models import AdminAction, Runbook
from ledger.services.tenancy.runbooks import runbook_html, runbook_set
from tests.factories import unknown_case
from tests.helpers import Browser

CANARY = """# Check the provider

<script>alert('canary-script')</script>
<img src=x onerror="alert('canary-onerror')">
[click me](javascript:alert('canary-js'))
[also](JaVaScRiPt:alert('canary-js2'))
<a href="javascript:alert('canary-raw')">raw</a>
[ok link](https://status.example.com/)
"""


class Markup(HTMLParser):
    """Every element and attribute a browser would build from the HTML (text is only text)."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend((name, value or "") for name, value in attrs)


def assert_inert(html: str) -> None:
    markup = Markup(html)
    assert not {"script", "img", "iframe", "style"} & set(markup.tags), markup.tags
    assert not [name for name, _ in markup.attrs if name.startswith("on")], markup.attrs
    hrefs = [value.strip().lower() for name, value in markup.attrs if name in ("href", "src")]
    assert all(h.startswith(("https:", "http:", "mailto:")) for h in hrefs), hrefs


def save(browser, slug="acme", **data):
    fields = {"subject": "reason", "name": "WORKER_REPORTED_UNKNOWN", "text": "Look it up.", "reason": "r", **data}
    return browser.post(reverse("tenant-runbook", args=[slug]), fields)


def test_the_sanitiser_drops_script_event_handlers_and_javascript_urls():
    html = runbook_html(CANARY)
    assert_inert(html)
    # Raw HTML is shown as text, never as markup; a safe link stays, with rel set.
    assert "&lt;script&gt;" in html
    assert '<a href="https://status.example.com/" rel="noopener noreferrer nofollow">ok link</a>' in html


def test_an_admin_writes_a_runbook_and_it_shows_sanitised_on_the_case(acme, admin, operator):
    case = unknown_case(acme.worker)  # the worker could not tell
    assert case.reason == "WORKER_REPORTED_UNKNOWN"
    page = save(Browser(admin), text=CANARY)
    assert page.status_code == 302
    row = Runbook.objects.get(tenant=acme.tenant, subject="reason", name="WORKER_REPORTED_UNKNOWN")
    assert row.updated_by == "user:ada" and row.text.startswith("# Check the provider")
    assert AdminAction.objects.filter(tenant=acme.tenant, action="runbook.set").count() == 1

    body = Browser(operator).get(reverse("cases")).content.decode()
    assert "runbook" in body and "for WORKER_REPORTED_UNKNOWN" in body and "status.example.com" in body
    start = body.index('<div class="runbook-body">')
    assert_inert(body[start : body.index("</details>", start)])
    # The tenant page shows it too, as sanitised.
    tenant_page = Browser(operator).get(reverse("tenant_detail", args=["acme"])).content.decode()
    start = tenant_page.index('<div class="runbook-body">')
    assert "status.example.com" in tenant_page
    assert_inert(tenant_page[start : tenant_page.index("</td>", start)])


def test_the_latest_verdicts_runbook_shows_beside_the_reasons(acme, admin, viewer):
    case = unknown_case(acme.worker)
    ReconciliationCase.objects.filter(pk=case.pk).update(
        lookup_history=[{"verdict": "CANNOT_TELL", "reconciler": "sandbox-payments", "why": "?"}]
    )
    runbook_set(
        tenant=acme.tenant, subject="verdict", name="CANNOT_TELL", text="Ask **payments**.", reason="r", user=admin
    )
    body = Browser(viewer).get(reverse("cases")).content.decode()
    assert "for verdict CANNOT_TELL" in body and "<strong>payments</strong>" in body
    assert "for WORKER_REPORTED_UNKNOWN" not in body  # none written for the reason


def test_an_empty_text_removes_the_runbook(acme, admin):
    runbook_set(tenant=acme.tenant, subject="reason", name="LEASE_LOST", text="x", reason="r", user=admin)
    assert (
        runbook_set(tenant=acme.tenant, subject="reason", name="LEASE_LOST", text="  ", reason="r", user=admin) is None
    )
    assert not Runbook.objects.exists()


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_without_the_admin_role_no_form_and_a_write_is_403(acme, people, role):
    browser = Browser(people[role])
    assert "Save runbook" not in browser.get(reverse("tenant_detail", args=["acme"])).content.decode()
    assert save(browser).status_code == 403
    with pytest.raises(Forbidden):
        runbook_set(tenant=acme.tenant, subject="reason", name="LEASE_LOST", text="x", reason="r", user=people[role])
    assert not Runbook.objects.exists()


def test_an_admin_sees_the_form(acme, admin):
    assert "Save runbook" in Browser(admin).get(reverse("tenant_detail", args=["acme"])).content.decode()


def test_another_tenants_runbook_is_404_and_not_shown(acme, outsider, admin, outsider_admin):
    assert save(Browser(admin), slug="globex").status_code == 404
    runbook_set(
        tenant=outsider.tenant,
        subject="reason",
        name="WORKER_REPORTED_UNKNOWN",
        text="globex-only",
        reason="r",
        user=outsider_admin,
    )
    unknown_case(acme.worker)
    assert "globex-only" not in Browser(admin).get(reverse("cases")).content.decode()


@pytest.mark.parametrize(
    "data, field",
    [
        ({"subject": "mood"}, "subject"),
        ({"name": "HAPPENED_TWICE"}, "name"),
        ({"subject": "verdict", "name": "LEASE_LOST"}, "name"),
        ({"text": "x" * 10_001}, "text"),
        ({"reason": ""}, "reason"),
    ],
)
def test_bad_input_is_422_naming_the_field_and_writes_nothing(acme, admin, data, field):
    page = save(Browser(admin), **data)
    assert page.status_code == 422
    assert field in page.content.decode()
    assert not Runbook.objects.exists()


def test_a_credential_in_a_runbook_is_refused_not_stored(acme, admin):
    secret = "AKIA" + "Q3EGWZ7ETXMPLW2K"
    with pytest.raises(ForbiddenField):
        runbook_set(
            tenant=acme.tenant, subject="reason", name="LEASE_LOST", text=f"use key {secret}", reason="r", user=admin
        )
    assert not Runbook.objects.exists()
