"""Upgrades: where each schema change stands (expand / migrate / contract), the backfill's
progress, the worker builds that cannot read what is being written, the StateConflicts a
person must decide, and the tenants whose effects are held after a restore. Deciding a
conflict (operators) and allowing effects (admins) go through ledger.services.upgrades,
which checks the role again; the view only reads the form."""

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from console.views.common import BAD_INPUT, HtmxHttpRequest, done, form_errors, tenant_for_action
from ledger import admin_selectors
from ledger.errors import DomainError
from ledger.models import StateConflict
from ledger.roles import ADMINISTER, OPERATE, tenants_for
from ledger.services.upgrades.conflicts import CHOICES, conflict_resolve
from ledger.services.upgrades.restore import effects_allow

TEMPLATE = "console/upgrades.html"


class ResolveForm(forms.Form):
    choice = forms.ChoiceField(choices=[(c, c) for c in CHOICES])
    reason = forms.CharField(max_length=500, strip=True)


class AllowForm(forms.Form):
    reason = forms.CharField(max_length=500, strip=True)


def _context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    return {
        **admin_selectors.upgrades_overview(user=request.user),
        "operable": set(tenants_for(request.user, OPERATE).values_list("pk", flat=True)),
        "administrable": set(tenants_for(request.user, ADMINISTER).values_list("pk", flat=True)),
        **extra,
    }


@require_GET
@login_required
def upgrades(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, TEMPLATE, _context(request))


@require_POST
@login_required
def conflict_decide(request: HtmxHttpRequest, conflict_id: int) -> HttpResponse:
    """Another tenant's conflict is a 404; the role is checked by the service (403)."""
    visible = StateConflict.objects.filter(tenant__in=admin_selectors.visible_tenants(user=request.user))
    conflict = get_object_or_404(visible, pk=conflict_id)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    try:
        conflict_resolve(
            conflict_id=conflict.pk,
            user=request.user,
            choice=form.cleaned_data["choice"],
            reason=form.cleaned_data["reason"],
        )
    except DomainError as exc:
        return render(request, TEMPLATE, _context(request, errors=[exc.detail]), status=exc.status)
    side = "provider_request_id" if form.cleaned_data["choice"] == "old" else "provider_ref"
    return done(request, f"Conflict on {conflict.record} resolved: {side} kept; its run may act again.", "/upgrades/")


@require_POST
@login_required
def allow_effects(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_for_action(request, slug, ADMINISTER)
    form = AllowForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    try:
        effects_allow(tenant=tenant.slug, reason=form.cleaned_data["reason"], user=request.user)
    except DomainError as exc:
        return render(request, TEMPLATE, _context(request, errors=[exc.detail]), status=exc.status)
    return done(
        request, f"Effects allowed for {tenant.slug}: its workers may authorize and dispatch again.", "/upgrades/"
    )
