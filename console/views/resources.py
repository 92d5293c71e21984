"""What runs hold: per tenant, live instances beside active operations, open resources by
state and age, cleanup alerts with their owners; for admins, "retry cleanup now" and "mark
released" with a reason. Writes go through ledger.services.lifespan.cleanup, which
re-checks the admin role."""

from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from console.views.common import BAD_INPUT, HtmxHttpRequest, done, form_errors, next_url
from ledger import admin_selectors
from ledger.errors import DomainError
from ledger.models import RunResource
from ledger.roles import ADMINISTER, VIEW, can, tenants_for
from ledger.services.lifespan.cleanup import MARKABLE, RETRYABLE, resource_mark_released, resource_retry_now

TEMPLATE = "console/resources.html"
ACTIONS = {"retry": resource_retry_now, "mark_released": resource_mark_released}


class ActionForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS])
    reason = forms.CharField(max_length=500, strip=True)


def _context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    tenant = request.GET.get("tenant", "").strip()
    state = request.GET.get("state", "").strip() or "open"
    notice = ""
    if state not in admin_selectors.RESOURCE_FILTERS:
        notice, state = f"Unknown state filter {state[:40]!r}: showing open resources.", "open"
    return {
        "overview": admin_selectors.lifespan_overview(user=request.user),
        "alerts": admin_selectors.alerts_open(user=request.user),
        "rows": admin_selectors.resources_listed(user=request.user, tenant=tenant, state=state),
        "filters": {"tenant": tenant, "state": state},
        "states": admin_selectors.RESOURCE_FILTERS,
        "tenants": list(tenants_for(request.user, VIEW).order_by("slug")),
        "administrable": set(tenants_for(request.user, ADMINISTER).values_list("pk", flat=True)),
        "retryable": RETRYABLE,
        "markable": MARKABLE,
        "notice": notice,
        **extra,
    }


@require_GET
@login_required
def resource_list(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, TEMPLATE, _context(request))


@require_POST
@login_required
def resource_act(request: HtmxHttpRequest, resource_id: UUID) -> HttpResponse:
    """Another tenant's resource is a 404; one the user sees but may not administer, 403."""
    visible = RunResource.objects.filter(tenant__in=admin_selectors.visible_tenants(user=request.user))
    resource = get_object_or_404(visible.select_related("tenant"), pk=resource_id)
    if not can(request.user, resource.tenant, ADMINISTER):
        raise PermissionDenied("your role on this tenant does not allow this action")
    form = ActionForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    action = form.cleaned_data["action"]
    try:
        changed = ACTIONS[action](
            tenant=resource.tenant, resource_id=resource.pk, reason=form.cleaned_data["reason"], user=request.user
        )
    except DomainError as exc:
        return render(request, TEMPLATE, _context(request, errors=[exc.detail]), status=exc.status)
    message = (
        f"{changed.kind} {changed.handle} is marked RELEASED."
        if action == "mark_released"
        else f"The reaper calls the driver for {changed.kind} {changed.handle} on its next pass."
    )
    return done(request, message, next_url(request, "/resources/"))
