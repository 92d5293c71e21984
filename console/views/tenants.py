"""Tenants: policy (current version, history, change), budgets and breaker, roles (grant),
and the tenant's record of admin decisions. Writes go through ledger.services.policy and
ledger.services.roles, which re-check the admin role."""

import json

from django import forms
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from console.views.common import BAD_INPUT, done, form_errors, tenant_for_action
from ledger import admin_selectors
from ledger.errors import DomainError
from ledger.roles import ADMINISTER, ROLES, can
from ledger.services.authority.policy import policy_change, policy_current
from ledger.services.tenancy.roles import role_grant

TEMPLATE = "console/tenant_detail.html"
MAX_POLICY_BYTES = 64 * 1024


class PolicyForm(forms.Form):
    document = forms.CharField(max_length=MAX_POLICY_BYTES, strip=True)
    reason = forms.CharField(max_length=500, strip=True)

    def clean_document(self):
        try:
            document = json.loads(self.cleaned_data["document"])
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        if not isinstance(document, dict):
            raise forms.ValidationError("the policy is a JSON object")
        return document


class GrantForm(forms.Form):
    username = forms.CharField(max_length=150, strip=True)
    role = forms.ChoiceField(choices=[(r, r) for r in ROLES])
    password = forms.CharField(max_length=128, required=False, strip=False, widget=forms.PasswordInput)
    reason = forms.CharField(max_length=500, strip=True)


@require_GET
@login_required
def tenant_list(request):
    return render(request, "console/tenants.html", {"rows": admin_selectors.tenant_list(user=request.user)})


def _detail_context(request, tenant, **extra) -> dict:
    version, document = policy_current(tenant=tenant)
    return {
        "tenant": tenant,
        "policy_version": version,
        "policy_json": json.dumps(document, indent=2, sort_keys=True),
        "can_administer": can(request.user, tenant, ADMINISTER),
        "role_names": list(ROLES),
        **admin_selectors.tenant_detail_parts(tenant=tenant),
        **extra,
    }


@require_GET
@login_required
def tenant_detail(request, slug: str):
    tenant = get_object_or_404(admin_selectors.visible_tenants(user=request.user), slug=slug)
    return render(request, TEMPLATE, _detail_context(request, tenant))


def _refused(request, tenant, message: str, status: int, **extra):
    return render(request, TEMPLATE, _detail_context(request, tenant, errors=[message], **extra), status=status)


@require_POST
@login_required
def change_policy(request, slug: str):
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
def grant_role(request, slug: str):
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
