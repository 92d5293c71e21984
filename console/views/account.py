"""A person's own settings page: their roles per tenant (what each lets them do) and where
"my cases" and "my approvals" go — a webhook they own or an email address — with the last
deliveries made to it. Writes go through ``ledger/services/notifications/routes.py``."""

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from console.views.common import BAD_INPUT, HtmxHttpRequest, done, form_errors
from ledger.errors import DomainError
from ledger.models import PersonalRoute, WebhookDelivery
from ledger.models.notifications import PersonalKind
from ledger.roles import roles_of
from ledger.services.notifications.routes import MAILTO, route_set, route_target_label

TEMPLATE = "console/settings.html"
RECENT = 10

WHAT_ROLES_DO = {
    "viewer": "see runs, cases, approvals, credentials and workers",
    "operator": "claim and resolve cases, cancel runs, read diagnostic payloads",
    "approver": "approve or deny approval requests",
    "admin": "everything: credentials, policy, workers, roles and runbooks too",
}


class RouteForm(forms.Form):
    target = forms.CharField(max_length=500, required=False, strip=True)
    kinds = forms.MultipleChoiceField(choices=PersonalKind.choices, required=False)
    remove = forms.BooleanField(required=False)


def _context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    route = PersonalRoute.objects.filter(user_id=request.user.pk).first() if request.user.pk else None
    deliveries = (
        list(WebhookDelivery.objects.filter(route=route).select_related("tenant").order_by("-created_at")[:RECENT])
        if route
        else []
    )
    return {
        "route": route,
        "route_label": route_target_label(route.target) if route else "",
        "route_is_email": bool(route and route.target.startswith(MAILTO)),
        "kind_choices": PersonalKind.choices,
        "chosen_kinds": route.kinds if route else list(PersonalKind.values),
        "deliveries": deliveries,
        "roles": [(tenant, role, WHAT_ROLES_DO[role]) for tenant, role in roles_of(request.user)],
        **extra,
    }


@require_GET
@login_required
def settings_page(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, TEMPLATE, _context(request))


@require_POST
@login_required
def route_save(request: HtmxHttpRequest) -> HttpResponse:
    form = RouteForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    try:
        data = form.cleaned_data
        saved = route_set(user=request.user, target=data["target"], kinds=data["kinds"], remove=data["remove"])
    except DomainError as exc:
        context = _context(request, errors=[exc.detail], draft=form.cleaned_data["target"])
        return render(request, TEMPLATE, context, status=exc.status)
    if saved.route is None:
        return done(request, "Your route is removed: nothing is sent to you.", "/settings/")
    if saved.secret:
        # Shown once, on this answer only: it is derived when a delivery is signed, never stored.
        notice = "Your route is saved. Its signing secret is shown once below."
        return render(request, TEMPLATE, _context(request, secret=saved.secret, notice=notice), status=201)
    return done(request, "Your route is saved.", "/settings/")
