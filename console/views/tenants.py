"""Tenants: policy (current version, history, change), tool contracts (add or replace,
remove, what unknown tools are), budgets and breaker, roles (grant), and the tenant's
record of admin decisions. Writes go through ledger.services.authority.policy and
ledger.services.tenancy.roles, which re-check the admin role."""

import json
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from console.views.common import BAD_INPUT, HtmxHttpRequest, done, form_errors, refused_field, tenant_for_action
from ledger import admin_selectors
from ledger.errors import DomainError
from ledger.models import Tenant
from ledger.policy import REFUSE, UNKNOWN_TOOL_CLASSES, WORKER_DECLARED, contracts_of, unknown_tool_class_of
from ledger.roles import ADMINISTER, ROLES, can
from ledger.services.authority.policy import (
    configured_reconcilers,
    contract_put,
    contract_remove,
    policy_change,
    policy_current,
    unknown_tool_class_set,
)
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.runbooks import MAX_TEXT as RUNBOOK_MAX_TEXT
from ledger.services.tenancy.runbooks import NAMES as RUNBOOK_NAMES
from ledger.services.tenancy.runbooks import runbook_set
from ledger.states import EffectClass

TEMPLATE = "console/tenant_detail.html"
MAX_POLICY_BYTES = 64 * 1024


class PolicyForm(forms.Form):
    document = forms.CharField(max_length=MAX_POLICY_BYTES, strip=True)
    reason = forms.CharField(max_length=500, strip=True)

    def clean_document(self) -> dict[str, Any]:
        try:
            document = json.loads(self.cleaned_data["document"])
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        if not isinstance(document, dict):
            raise forms.ValidationError("the policy is a JSON object")
        return document


class ContractForm(forms.Form):
    tool = forms.CharField(max_length=200, strip=True)
    action = forms.CharField(max_length=200, strip=True, required=False)
    effect_class = forms.ChoiceField(choices=EffectClass.choices)
    provider = forms.CharField(max_length=200, strip=True, required=False)
    reconciler = forms.CharField(max_length=200, strip=True, required=False)  # the service checks the name
    worst_case_cost_cents = forms.IntegerField(min_value=0, required=False)
    human_approval = forms.BooleanField(required=False)
    reason = forms.CharField(max_length=500, strip=True)

    def contract(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "tool": data["tool"],
            "action": data["action"] or "*",
            "effect_class": data["effect_class"],
            "provider": data["provider"] or None,
            "reconciler": data["reconciler"] or None,
            "worst_case_cost_cents": data["worst_case_cost_cents"],
            "human_approval": data["human_approval"],
        }


class ContractRemoveForm(forms.Form):
    tool = forms.CharField(max_length=200, strip=True)
    action = forms.CharField(max_length=200, strip=True)
    reason = forms.CharField(max_length=500, strip=True)


class UnknownToolClassForm(forms.Form):
    unknown_tool_class = forms.ChoiceField(choices=[(c, c) for c in UNKNOWN_TOOL_CLASSES])
    reason = forms.CharField(max_length=500, strip=True)


def unknown_tool_label(value: str) -> str:
    """What happens to a tool without a contract, in words."""
    if value == WORKER_DECLARED:
        return "starter: the worker's declared class is taken"
    if value == REFUSE:
        return "its operations are refused"
    return f"taken as {value}, whatever the worker declares"


class GrantForm(forms.Form):
    username = forms.CharField(max_length=150, strip=True)
    role = forms.ChoiceField(choices=[(r, r) for r in ROLES])
    password = forms.CharField(max_length=128, required=False, strip=False, widget=forms.PasswordInput)
    reason = forms.CharField(max_length=500, strip=True)


@require_GET
@login_required
def tenant_list(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, "console/tenants.html", {"rows": admin_selectors.tenant_list(user=request.user)})


def _detail_context(request: HtmxHttpRequest, tenant: Tenant, **extra: Any) -> dict[str, Any]:
    version, document = policy_current(tenant=tenant)
    unknown = unknown_tool_class_of(document)
    return {
        "tenant": tenant,
        "policy_version": version,
        "policy_json": json.dumps(document, indent=2, sort_keys=True),
        "can_administer": can(request.user, tenant, ADMINISTER),
        "contracts": contracts_of(document),
        "unknown_tool_class": unknown,
        "unknown_tool_label": unknown_tool_label(unknown),
        "unknown_tool_choices": [(c, unknown_tool_label(c)) for c in UNKNOWN_TOOL_CLASSES],
        "effect_classes": EffectClass.values,
        "reconciler_names": sorted(configured_reconcilers()),
        "role_names": list(ROLES),
        "runbooks": admin_selectors.tenant_runbooks(tenant=tenant),
        **admin_selectors.tenant_detail_parts(tenant=tenant),
        **extra,
    }


@require_GET
@login_required
def tenant_detail(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = get_object_or_404(admin_selectors.visible_tenants(user=request.user), slug=slug)
    return render(request, TEMPLATE, _detail_context(request, tenant))


def _refused(request: HtmxHttpRequest, tenant: Tenant, message: str, status: int, **extra: Any) -> HttpResponse:
    return render(request, TEMPLATE, _detail_context(request, tenant, errors=[message], **extra), status=status)


@require_POST
@login_required
def change_policy(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = PolicyForm(request.POST)
    if not form.is_valid():
        return _refused(request, tenant, form_errors(form), BAD_INPUT, draft=request.POST.get("document", ""))
    try:
        row = policy_change(
            tenant=tenant, document=form.cleaned_data["document"], reason=form.cleaned_data["reason"], user=request.user
        )
    except DomainError as exc:
        return _refused(request, tenant, exc.detail, exc.status, draft=request.POST.get("document", ""))
    return done(request, f"Policy version {row.version} is now current for {tenant.slug}.", f"/tenants/{tenant.slug}/")


@require_POST
@login_required
def grant_role(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = GrantForm(request.POST)
    if not form.is_valid():
        return _refused(request, tenant, form_errors(form), BAD_INPUT)
    data = form.cleaned_data
    try:
        _, created = role_grant(
            username=data["username"],
            tenant=tenant,
            role=data["role"],
            password=data["password"] or None,
            user=request.user,
            reason=data["reason"],
        )
    except DomainError as exc:
        return _refused(request, tenant, exc.detail, exc.status)
    who = f"New user {data['username']}" if created else data["username"]
    return done(request, f"{who} is now {data['role']} on {tenant.slug}.", f"/tenants/{tenant.slug}/#roles")


CONTRACTS_PARTIAL = f"{TEMPLATE}#contracts"


def _contracts_answer(
    request: HtmxHttpRequest,
    tenant: Tenant,
    *,
    message: str = "",
    errors: list[str] | None = None,
    status: int = 200,
    **extra: Any,
) -> HttpResponse:
    """After a contract change: htmx gets the refreshed section (and a toast); a plain form
    post is redirected back, or shown the page with the error and its status. htmx swaps
    no 4xx answer, so its refusal comes with 200 and the error in the section."""
    if request.htmx:
        context = _detail_context(request, tenant, contract_errors=errors or [], toast=message, **extra)
        return render(request, CONTRACTS_PARTIAL, context)
    if errors:
        context = _detail_context(request, tenant, contract_errors=errors, **extra)
        return render(request, TEMPLATE, context, status=status)
    return done(request, message, f"/tenants/{tenant.slug}/#tool-contracts")


def _field_of(exc: DomainError) -> str:
    """The contract form's field a service refusal names (``contract.effect_class``)."""
    return refused_field(exc).removeprefix("contract.")


@require_POST
@login_required
def put_contract(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = ContractForm(request.POST)
    draft: dict[str, Any] = {"contract_draft": request.POST, "open_contract_form": True}
    if not form.is_valid():
        return _contracts_answer(request, tenant, errors=[form_errors(form)], status=BAD_INPUT, **draft)
    try:
        row, replaced = contract_put(
            tenant=tenant, contract=form.contract(), reason=form.cleaned_data["reason"], user=request.user
        )
    except DomainError as exc:
        return _contracts_answer(
            request, tenant, errors=[exc.detail], status=exc.status, contract_error_field=_field_of(exc), **draft
        )
    what = "replaced" if replaced else "added"
    name = f"{form.contract()['tool']}.{form.contract()['action']}"
    return _contracts_answer(request, tenant, message=f"Contract {name} {what}: policy version {row.version}.")


@require_POST
@login_required
def remove_contract(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = ContractRemoveForm(request.POST)
    if not form.is_valid():
        return _contracts_answer(request, tenant, errors=[form_errors(form)], status=BAD_INPUT)
    data = form.cleaned_data
    try:
        row = contract_remove(
            tenant=tenant, tool=data["tool"], action=data["action"], reason=data["reason"], user=request.user
        )
    except DomainError as exc:
        return _contracts_answer(request, tenant, errors=[exc.detail], status=exc.status)
    message = f"Contract {data['tool']}.{data['action']} removed: policy version {row.version}."
    return _contracts_answer(request, tenant, message=message)


@require_POST
@login_required
def set_unknown_tool_class(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = UnknownToolClassForm(request.POST)
    if not form.is_valid():
        return _contracts_answer(request, tenant, errors=[form_errors(form)], status=BAD_INPUT)
    value = form.cleaned_data["unknown_tool_class"]
    try:
        row = unknown_tool_class_set(tenant=tenant, value=value, reason=form.cleaned_data["reason"], user=request.user)
    except DomainError as exc:
        return _contracts_answer(request, tenant, errors=[exc.detail], status=exc.status)
    message = f"Tools without a contract: {unknown_tool_label(value)} (policy version {row.version})."
    return _contracts_answer(request, tenant, message=message)


class RunbookForm(forms.Form):
    subject = forms.ChoiceField(choices=[(s, s) for s in RUNBOOK_NAMES])
    name = forms.CharField(max_length=32)
    text = forms.CharField(max_length=RUNBOOK_MAX_TEXT, required=False, strip=True, widget=forms.Textarea)
    reason = forms.CharField(max_length=500, strip=True)


@require_POST
@login_required
def set_runbook(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Write (or, emptied, remove) one runbook; the service checks the name, the text and
    the admin role again."""
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = RunbookForm(request.POST)
    if not form.is_valid():
        return _refused(request, tenant, form_errors(form), BAD_INPUT)
    data = form.cleaned_data
    try:
        row = runbook_set(
            tenant=tenant,
            subject=data["subject"],
            name=data["name"],
            text=data["text"],
            reason=data["reason"],
            user=request.user,
        )
    except DomainError as exc:
        return _refused(request, tenant, exc.detail, exc.status)
    what = "saved" if row is not None else "removed"
    return done(request, f"Runbook for {data['subject']} {data['name']} {what}.", f"/tenants/{tenant.slug}/#runbooks")
