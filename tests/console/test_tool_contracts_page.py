"""The tenant page's tool contracts: everyone with a role reads them; only an admin adds,
replaces or removes one or sets what unknown tools are, each a new policy version through
the policy service; another tenant's is a 404; bad input writes nothing and names the field."""

import pytest
from django.urls import reverse

from ledger.models import TenantPolicy
from ledger.services.authority.policy import contract_put, policy_current
from tests.helpers import Browser

CHARGE = {
    "tool": "payments",
    "action": "charge",
    "effect_class": "NON_RETRYABLE",
    "provider": "sandbox-payments",
    "reconciler": "sandbox-payments",
    "worst_case_cost_cents": "5000",
    "human_approval": "on",
    "reason": "charges are final",
}


def put(slug="acme"):
    return reverse("tenant-contract-put", args=[slug])


def remove(slug="acme"):
    return reverse("tenant-contract-remove", args=[slug])


def unknown(slug="acme"):
    return reverse("tenant-unknown-tool-class", args=[slug])


def versions(tenant) -> int:
    return TenantPolicy.objects.filter(tenant=tenant).count()


def contracts(tenant) -> list[dict]:
    return policy_current(tenant=tenant)[1]["tool_contracts"]


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_without_the_admin_role_contracts_are_read_only(acme, role, people):
    contract_put(
        tenant=acme.tenant,
        contract={"tool": "search", "effect_class": "PURE"},
        reason="reads only",
        changed_by="t",
    )
    browser = Browser(people[role])
    body = browser.get(reverse("tenant_detail", args=["acme"])).content.decode()
    assert "Tool contracts" in body and ">search<" in body
    assert "starter: the worker&#x27;s declared class is taken" in body
    assert "Save contract" not in body and "Remove search" not in body
    assert browser.post(put(), CHARGE).status_code == 403
    assert browser.post(remove(), {"tool": "search", "action": "*", "reason": "r"}).status_code == 403
    assert browser.post(unknown(), {"unknown_tool_class": "REFUSE", "reason": "r"}).status_code == 403
    assert versions(acme.tenant) == 2


def test_an_admin_adds_replaces_and_removes_a_contract_each_a_new_version(acme, admin):
    browser = Browser(admin)
    assert browser.post(put(), CHARGE).status_code == 302
    assert contracts(acme.tenant) == [
        {
            "tool": "payments",
            "action": "charge",
            "effect_class": "NON_RETRYABLE",
            "provider": "sandbox-payments",
            "reconciler": "sandbox-payments",
            "worst_case_cost_cents": 5000,
            "human_approval": True,
        }
    ]
    row = TenantPolicy.objects.get(tenant=acme.tenant, version=2)
    assert (row.created_by, row.reason) == ("ada", "charges are final")

    replaced = {**CHARGE, "effect_class": "UNKNOWN", "human_approval": "", "reason": "unsure"}
    del replaced["human_approval"]
    assert browser.post(put(), replaced).status_code == 302
    assert [(c["effect_class"], c["human_approval"]) for c in contracts(acme.tenant)] == [("UNKNOWN", False)]

    page = browser.get(reverse("tenant_detail", args=["acme"]))
    assert "Remove payments.charge" in page.content.decode()
    assert browser.post(remove(), {"tool": "payments", "action": "charge", "reason": "gone"}).status_code == 302
    assert contracts(acme.tenant) == []
    assert versions(acme.tenant) == 4


def test_an_admin_sets_what_tools_without_a_contract_are(acme, admin):
    browser = Browser(admin)
    assert browser.post(unknown(), {"unknown_tool_class": "REFUSE", "reason": "contracts first"}).status_code == 302
    assert policy_current(tenant=acme.tenant)[1]["unknown_tool_class"] == "REFUSE"
    body = browser.get(reverse("tenant_detail", args=["acme"])).content.decode()
    assert "its operations are refused" in body


def test_an_htmx_change_answers_with_the_section_and_a_toast(acme, admin):
    browser = Browser(admin)
    answer = browser.post(put(), {**CHARGE, "action": ""}, HTTP_HX_REQUEST="true")
    body = answer.content.decode()
    assert answer.status_code == 200 and body.startswith('\n<section id="tool-contracts"')
    assert "Contract payments.* added: policy version 2." in body and 'hx-swap-oob="beforeend:#toasts"' in body
    assert '<h2 id="budgets">' not in body


def test_another_tenants_contracts_are_404(acme, outsider, admin):
    browser = Browser(admin)
    assert browser.post(put("globex"), CHARGE).status_code == 404
    assert browser.post(remove("globex"), {"tool": "x", "action": "*", "reason": "r"}).status_code == 404
    assert browser.post(unknown("globex"), {"unknown_tool_class": "REFUSE", "reason": "r"}).status_code == 404
    assert versions(outsider.tenant) == 1


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"effect_class": "SOMETIMES"}, "effect class: Select a valid choice"),
        ({"worst_case_cost_cents": "-5"}, "worst case cost cents:"),
        ({"reason": ""}, "reason: This field is required"),
        ({"tool": "pay*"}, "contract.tool must be a tool name"),
        ({"reconciler": "nobody"}, "contract.reconciler: no reconciler named &#x27;nobody&#x27; is configured"),
    ],
)
def test_bad_contract_input_writes_nothing_and_names_the_field(acme, change, named, admin):
    browser = Browser(admin)
    answer = browser.post(put(), {**CHARGE, **change})
    assert answer.status_code == 422
    assert named in answer.content.decode()
    assert versions(acme.tenant) == 1


def test_removing_a_missing_contract_or_changing_nothing_writes_nothing(acme, admin):
    browser = Browser(admin)
    answer = browser.post(remove(), {"tool": "payments", "action": "charge", "reason": "r"})
    assert answer.status_code == 404 and "no contract for payments.charge" in answer.content.decode()
    answer = browser.post(unknown(), {"unknown_tool_class": "WORKER_DECLARED", "reason": "r"})
    assert answer.status_code == 422 and "nothing changes" in answer.content.decode()
    assert browser.post(unknown(), {"unknown_tool_class": "MAYBE", "reason": "r"}).status_code == 422
    assert versions(acme.tenant) == 1
