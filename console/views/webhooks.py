"""A tenant's webhooks: its endpoints (create, change, disable / enable, rotate the signing
secret) and the delivery log, newest first. Admins only: an endpoint says where the
tenant's notifications go, and the log is for the person who can fix an endpoint; any other
role gets 403, and another tenant's page is a 404. Writes go through
ledger.services.notifications.endpoints, which re-checks the admin role.

A signing secret is shown once, in the answer to the POST that made it (create, rotate),
with ``Cache-Control: no-store``; it is never put in the session or any other store."""

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from console.views.common import BAD_INPUT, HtmxHttpRequest, done, form_errors, refused_field, tenant_for_action
from ledger.errors import DomainError
from ledger.models import Tenant, WebhookDelivery, WebhookEndpoint
from ledger.models.notifications import NotificationKind
from ledger.pagination import keyset_page
from ledger.roles import ADMINISTER
from ledger.services.notifications.endpoints import (
    MAX_UNKNOWN_AFTER_S,
    MIN_UNKNOWN_AFTER_S,
    endpoint_create,
    endpoint_rotate_secret,
    endpoint_set_enabled,
    endpoint_update,
)
from ledger.services.notifications.targets import target_label

TEMPLATE = "console/webhooks.html"
LOG_PAGE_SIZE = 50


class EndpointForm(forms.Form):
    name = forms.CharField(max_length=64, strip=True)
    target = forms.CharField(max_length=500, strip=True)
    kinds = forms.MultipleChoiceField(choices=NotificationKind.choices)
    unknown_after_min = forms.IntegerField(min_value=MIN_UNKNOWN_AFTER_S // 60, max_value=MAX_UNKNOWN_AFTER_S // 60)
    reason = forms.CharField(max_length=500, strip=True)


class EndpointChangeForm(forms.Form):
    target = forms.CharField(max_length=500, strip=True, required=False)  # blank: unchanged
    kinds = forms.MultipleChoiceField(choices=NotificationKind.choices)
    unknown_after_min = forms.IntegerField(min_value=MIN_UNKNOWN_AFTER_S // 60, max_value=MAX_UNKNOWN_AFTER_S // 60)
    reason = forms.CharField(max_length=500, strip=True)


class EnabledForm(forms.Form):
    enabled = forms.ChoiceField(choices=[("on", "enable"), ("off", "disable")])
    reason = forms.CharField(max_length=500, strip=True)


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=500, strip=True)


@dataclass(frozen=True)
class EndpointRow:
    """An endpoint as the page shows it: its target as a label (a reference by name, a URL
    by scheme and host) and its UNKNOWN age in minutes. The template reads the endpoint's own fields
    (``e.name``, ``e.kinds``, ...) through the row."""

    endpoint: WebhookEndpoint
    target_shown: str
    unknown_after_min: int

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):  # copy and pickle look for hooks before the row is built
            raise AttributeError(name)
        return getattr(self.endpoint, name)


def _context(request: HtmxHttpRequest, tenant: Tenant, **extra: Any) -> dict[str, Any]:
    endpoints = [
        EndpointRow(endpoint, target_label(endpoint.target), endpoint.unknown_after_s // 60)
        for endpoint in WebhookEndpoint.objects.filter(tenant=tenant).order_by("name")
    ]
    # A person's own deliveries (PersonalRoute) are theirs, not the tenant's log.
    log = WebhookDelivery.objects.filter(tenant=tenant, endpoint__isnull=False).select_related("endpoint")
    log_page = keyset_page(
        log,
        order_field="created_at",
        cursor=request.GET.get("before") or None,
        size=LOG_PAGE_SIZE,
        descending=True,
        count=False,
    )
    return {
        "tenant": tenant,
        "endpoints": endpoints,
        "deliveries": log_page.rows,
        "next_cursor": log_page.next_cursor,
        "kind_choices": NotificationKind.choices,
        "kind_labels": dict(NotificationKind.choices),
        **extra,
    }


def _page(request: HtmxHttpRequest, tenant: Tenant, *, status: int = 200, **extra: Any) -> HttpResponse:
    response = render(request, TEMPLATE, _context(request, tenant, **extra), status=status)
    if "secret" in extra:
        response["Cache-Control"] = "no-store"
    return response


def _refused(request: HtmxHttpRequest, tenant: Tenant, message: str, status: int, field: str = "") -> HttpResponse:
    return _page(request, tenant, status=status, errors=[message], error_field=field)


def _endpoint(tenant: Tenant, endpoint_id: UUID) -> WebhookEndpoint:
    try:
        return WebhookEndpoint.objects.get(tenant=tenant, pk=endpoint_id)
    except WebhookEndpoint.DoesNotExist:
        raise Http404("no such webhook on this tenant") from None


@require_GET
@login_required
def webhooks_page(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    return _page(request, tenant)


@require_POST
@login_required
def webhook_create(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = EndpointForm(request.POST)
    if not form.is_valid():
        return _refused(request, tenant, form_errors(form), BAD_INPUT, next(iter(form.errors), ""))
    data = form.cleaned_data
    try:
        made = endpoint_create(
            tenant=tenant,
            name=data["name"],
            target=data["target"],
            kinds=data["kinds"],
            unknown_after_s=data["unknown_after_min"] * 60,
            reason=data["reason"],
            user=request.user,
        )
    except DomainError as exc:
        return _refused(request, tenant, exc.detail, exc.status, refused_field(exc))
    message = f"Webhook {made.endpoint.name} created."
    return _page(request, tenant, status=201, secret=made.secret, secret_for=made.endpoint.name, notice=message)


@require_POST
@login_required
def webhook_update(request: HtmxHttpRequest, slug: str, endpoint_id: UUID) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    endpoint = _endpoint(tenant, endpoint_id)
    form = EndpointChangeForm(request.POST)
    if not form.is_valid():
        return _refused(request, tenant, form_errors(form), BAD_INPUT, next(iter(form.errors), ""))
    data = form.cleaned_data
    try:
        endpoint_update(
            tenant=tenant,
            endpoint_id=endpoint.pk,
            target=data["target"] or None,
            kinds=data["kinds"],
            unknown_after_s=data["unknown_after_min"] * 60,
            reason=data["reason"],
            user=request.user,
        )
    except DomainError as exc:
        return _refused(request, tenant, exc.detail, exc.status, refused_field(exc))
    return done(request, f"Webhook {endpoint.name} changed.", f"/tenants/{tenant.slug}/webhooks/")


@require_POST
@login_required
def webhook_set_enabled(request: HtmxHttpRequest, slug: str, endpoint_id: UUID) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    endpoint = _endpoint(tenant, endpoint_id)
    form = EnabledForm(request.POST)
    if not form.is_valid():
        return _refused(request, tenant, form_errors(form), BAD_INPUT, next(iter(form.errors), ""))
    enabled = form.cleaned_data["enabled"] == "on"
    try:
        endpoint_set_enabled(
            tenant=tenant,
            endpoint_id=endpoint.pk,
            enabled=enabled,
            reason=form.cleaned_data["reason"],
            user=request.user,
        )
    except DomainError as exc:
        return _refused(request, tenant, exc.detail, exc.status, refused_field(exc))
    what = "enabled" if enabled else "disabled: its pending deliveries are given up"
    return done(request, f"Webhook {endpoint.name} {what}.", f"/tenants/{tenant.slug}/webhooks/")


@require_POST
@login_required
def webhook_rotate(request: HtmxHttpRequest, slug: str, endpoint_id: UUID) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    endpoint = _endpoint(tenant, endpoint_id)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return _refused(request, tenant, form_errors(form), BAD_INPUT, next(iter(form.errors), ""))
    try:
        made = endpoint_rotate_secret(
            tenant=tenant, endpoint_id=endpoint.pk, reason=form.cleaned_data["reason"], user=request.user
        )
    except DomainError as exc:
        return _refused(request, tenant, exc.detail, exc.status, refused_field(exc))
    message = f"Webhook {endpoint.name} has a new signing secret (key version {made.endpoint.key_version})."
    return _page(request, tenant, secret=made.secret, secret_for=endpoint.name, notice=message)
