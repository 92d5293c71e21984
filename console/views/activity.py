"""The activity feed and audit search (``/activity/``): what happened in the tenants the
user sees — every chain event and every person's or job's admin record — newest first,
narrowed by who, what kind of actor, tenant, type and time, live (htmx polling), in keyset
pages (``ledger.activity``). A filter that is not valid is a form error with status 400,
never a 500 and never a silently different list."""

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from console.views.common import HtmxHttpRequest
from console.views.paging import pager, paging
from ledger.activity import KINDS, ActivityFilters, ActivityPage, activity_page
from ledger.roles import tenants_for

TEMPLATE = "console/activity.html"
WITHIN = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
WITHIN_LABELS = {"1h": "the last hour", "24h": "the last day", "7d": "the last week"}
# Suggestions for the type field (any event or admin record type may be typed).
COMMON_TYPES = (
    "RUN_CREATED",
    "LEASE_ACQUIRED",
    "LEASE_EXPIRED",
    "OPERATION_DISPATCHED",
    "OPERATION_UNKNOWN",
    "CASE_OPENED",
    "CASE_CLAIMED",
    "CASE_RESOLVED",
    "APPROVAL_GRANTED",
    "APPROVAL_DENIED",
    "RUN_CANCELLED",
    "STALE_TOKEN_REJECTED",
    "NOTE",
    "worker.drain",
    "worker.quarantine",
    "credential_lease.revoke",
    "credential.rotate",
    "policy.change",
    "role.grant",
)


class ActivityForm(forms.Form):
    who = forms.RegexField(
        regex=r"^\S{1,160}$",
        required=False,
        strip=True,
        error_messages={"invalid": "a username or an actor such as system:lease-reaper, without spaces."},
    )
    kind = forms.ChoiceField(required=False, choices=[("", "anyone"), *[(k, k) for k in KINDS]])
    tenant = forms.ChoiceField(required=False, choices=())
    type = forms.RegexField(
        regex=r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$",
        required=False,
        strip=True,
        error_messages={"invalid": "an event type (CASE_RESOLVED, x.mine) or an admin record (worker.drain)."},
    )
    within = forms.ChoiceField(required=False, choices=[("", "any time"), *WITHIN_LABELS.items()])
    since = forms.DateTimeField(required=False, error_messages={"invalid": "a date and time, e.g. 2026-12-06 14:00."})
    until = forms.DateTimeField(required=False, error_messages={"invalid": "a date and time, e.g. 2026-12-06 15:00."})

    def __init__(self, *args: Any, tenants: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tenant"]
        if isinstance(field, forms.ChoiceField):
            field.choices = [("", "any"), *[(slug, slug) for slug in tenants]]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and until <= since:
            self.add_error("until", "must be later than since.")
        return data

    def filters(self) -> ActivityFilters:
        data = self.cleaned_data
        since = data.get("since")
        if data.get("within"):
            recent = timezone.now() - WITHIN[data["within"]]
            since = max(since, recent) if since else recent
        return ActivityFilters(
            who=data.get("who") or "",
            kind=data.get("kind") or "",
            tenant=data.get("tenant") or "",
            type=data.get("type") or "",
            since=since,
            until=data.get("until"),
        )


@require_GET
@login_required
@vary_on_headers("HX-Request")
def activity(request: HtmxHttpRequest) -> HttpResponse:
    tenants = list(tenants_for(request.user).order_by("slug").values_list("slug", flat=True))
    form = ActivityForm(request.GET, tenants=tenants)
    where = paging(request)
    status = 200
    if form.is_valid():
        page = activity_page(
            user=request.user, filters=form.filters(), cursor=where.cursor, back=where.back, size=where.size
        )
    else:
        page, status = ActivityPage([], None, None, where.size), 400
    context = {
        "form": form,
        "rows": page.rows,
        "notices": [where.notice] if where.notice else [],
        "kinds": list(KINDS),
        "tenants": tenants,
        "types": COMMON_TYPES,
        "within_labels": WITHIN_LABELS,
        "pager": pager(request, page, where, list_name="activity", noun="entries"),
        "query": request.GET.urlencode(),
    }
    swap = request.htmx and not request.htmx.history_restore_request and request.htmx.target == "activity-feed"
    return render(request, f"{TEMPLATE}#feed" if swap else TEMPLATE, context, status=status)
