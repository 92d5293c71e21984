"""Credential leases: the list (filter by tenant, principal, state, lease-id prefix), a
preview of what a revocation touches (leases, runs, operations in flight), revoke one,
by principal or by prefix, and rotate a credential. Writes go through
ledger.services.credentials, which re-checks the admin role."""

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.template.defaultfilters import pluralize
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from console.views.common import BAD_INPUT, HtmxHttpRequest, chosen, done, form_errors, tenant_for_action
from console.views.paging import pager, paging
from ledger import admin_selectors
from ledger.errors import DomainError
from ledger.pagination import Page
from ledger.roles import ADMINISTER, VIEW, tenants_for
from ledger.services.authority.credential_leases import credential_lease_revoke, credential_leases_revoke
from ledger.services.authority.credentials import credential_rotate

TEMPLATE = "console/credentials.html"
PREVIEW_TEMPLATE = "console/revoke_preview.html"


class SelectionForm(forms.Form):
    """Which leases a revocation names: one lease, or the active ones by principal and/or prefix."""

    tenant = forms.SlugField(max_length=64)
    lease = forms.CharField(max_length=36, required=False, strip=True)
    principal = forms.CharField(max_length=200, required=False, strip=True)
    # A field named like BaseForm.prefix: Django's form metaclass moves declared fields into
    # base_fields, so the form's own ``prefix`` stays None.
    prefix = forms.CharField(max_length=36, required=False, strip=True)  # type: ignore[assignment]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not (data.get("lease") or data.get("principal") or data.get("prefix")):
            raise forms.ValidationError("Name a lease, a principal or a lease-id prefix.")
        if data.get("lease") and (data.get("principal") or data.get("prefix")):
            raise forms.ValidationError("Revoke one lease, or revoke by principal and/or prefix, not both.")
        return data


class RevokeForm(SelectionForm):
    reason = forms.CharField(max_length=500, strip=True)


class RotateForm(forms.Form):
    tenant = forms.SlugField(max_length=64)
    principal = forms.CharField(max_length=200, strip=True)
    reason = forms.CharField(max_length=500, strip=True)


def _filters(request: HtmxHttpRequest) -> tuple[dict[str, str], str]:
    params = request.GET
    state, notice = chosen(request, "state", admin_selectors.LEASE_STATES, "active")
    filters = {
        "tenant": params.get("tenant", "").strip(),
        "principal": params.get("principal", "").strip(),
        "state": state,
        "prefix": params.get("prefix", "").strip(),
    }
    return filters, notice


def _page_context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    filters, notice = _filters(request)
    errors = list(extra.pop("errors", []))
    where = paging(request)
    try:
        page = admin_selectors.credential_lease_list(
            user=request.user, cursor=where.cursor, back=where.back, size=where.size, **filters
        )
    except DomainError as exc:
        page = Page([], None, None, 0, False, where.size)
        errors.append(exc.detail)
    sized = {"size": where.size} if request.GET.get("size") else {}
    query = urlencode({**{k: v for k, v in filters.items() if v}, **sized})
    return {
        "rows": page.rows,
        "next_cursor": page.next_cursor,
        "pager": pager(
            request, page, where, list_name="credentials", total=page.total, capped=page.capped, noun="leases"
        ),
        "filters": filters,
        "query": query,
        "states": admin_selectors.LEASE_STATES,
        "tenants": list(tenants_for(request.user, VIEW).order_by("slug")),
        "credentials": admin_selectors.credentials_list(user=request.user, tenant=filters["tenant"]),
        "administrable": set(tenants_for(request.user, ADMINISTER).values_list("pk", flat=True)),
        "errors": errors,
        "notices": [n for n in (notice, where.notice) if n],
        **extra,
    }


@require_GET
@login_required
@vary_on_headers("HX-Request")
def lease_list(request: HtmxHttpRequest) -> HttpResponse:
    context = _page_context(request)
    if request.htmx and not request.htmx.history_restore_request and request.htmx.target == "leases-table":
        return render(request, f"{TEMPLATE}#table", context)
    return render(request, TEMPLATE, context)


def _selection(form: SelectionForm) -> dict[str, str]:
    data = form.cleaned_data
    return {"lease_id": data.get("lease", ""), "principal": data.get("principal", ""), "prefix": data.get("prefix", "")}


@require_GET
@login_required
def revoke_preview(request: HtmxHttpRequest) -> HttpResponse:
    """What a revocation would touch, read-only; the confirm form posts to ``revoke``."""
    form = SelectionForm(request.GET)
    if not form.is_valid():
        return render(request, TEMPLATE, _page_context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    tenant = tenant_for_action(request, form.cleaned_data["tenant"], ADMINISTER)
    try:
        preview = admin_selectors.revocation_preview(tenant=tenant, **_selection(form))
    except DomainError as exc:
        return render(request, TEMPLATE, _page_context(request, errors=[exc.detail]), status=exc.status)
    context = {"tenant": tenant, "selection": form.cleaned_data, "preview": preview}
    return render(request, PREVIEW_TEMPLATE, context)


@require_POST
@login_required
def revoke(request: HtmxHttpRequest) -> HttpResponse:
    form = RevokeForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _page_context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    tenant = tenant_for_action(request, form.cleaned_data["tenant"], ADMINISTER)
    selection, reason = _selection(form), form.cleaned_data["reason"]
    try:
        if selection["lease_id"]:
            revocation = credential_lease_revoke(
                tenant=tenant, lease_id=selection["lease_id"], reason=reason, user=request.user
            )
            short_id = str(revocation.lease.pk)[:8]
            message = (
                f"Lease {short_id} revoked." if revocation.revoked_now else f"Lease {short_id} was already revoked."
            )

        else:
            revoked = credential_leases_revoke(
                tenant=tenant,
                principal=selection["principal"] or None,
                prefix=selection["prefix"] or None,
                reason=reason,
                user=request.user,
            )
            message = f"{len(revoked)} lease{pluralize(len(revoked))} revoked."
    except DomainError as exc:
        return render(request, TEMPLATE, _page_context(request, errors=[exc.detail]), status=exc.status)
    return done(request, message, f"/credentials/?tenant={tenant.slug}&state=revoked")


@require_POST
@login_required
def rotate(request: HtmxHttpRequest) -> HttpResponse:
    form = RotateForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _page_context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    tenant = tenant_for_action(request, form.cleaned_data["tenant"], ADMINISTER)
    try:
        rotation = credential_rotate(
            tenant=tenant,
            principal=form.cleaned_data["principal"],
            reason=form.cleaned_data["reason"],
            user=request.user,
        )
    except DomainError as exc:
        return render(request, TEMPLATE, _page_context(request, errors=[exc.detail]), status=exc.status)
    message = (
        f"{rotation.credential.principal} rotated to version {rotation.credential.version}; "
        f"{len(rotation.affected_run_ids)} run{pluralize(len(rotation.affected_run_ids))} holding older leases "
        f"{pluralize(len(rotation.affected_run_ids), 'was,were')} told."
    )
    return done(request, message, f"/credentials/?tenant={tenant.slug}")
