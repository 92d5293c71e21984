"""The reconciliation queue: every UNKNOWN effect with what is known about it; claim,
resolve (happened / did not happen / compensated), escalate, and bulk resolve with a
preview of exactly the cases it will touch. Each action goes through approvals.services."""

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from approvals.models import ReconciliationCase
from approvals.selectors import (
    CASE_FILTERS,
    GROUP_ACTION_CAP,
    SORTS,
    case_groups,
    case_queue,
    cases_for,
    group_case_ids,
    with_case_deadlines,
)
from approvals.services.cases import (
    BULK_ACTIONS,
    BULK_RESOLUTIONS,
    COMMENT_MAX_LENGTH,
    RESOLUTIONS,
    case_claim,
    case_comment,
    case_escalate,
    case_reassign,
    case_resolve,
    case_unclaim,
    cases_claim_bulk,
    cases_escalate_bulk,
    cases_preview,
    cases_resolve_bulk,
)
from console.views.common import (
    BAD_INPUT,
    HtmxHttpRequest,
    bulk_preview,
    chosen,
    form_errors,
    queue_answer,
    selected_for_action,
)
from console.views.paging import pager, paging
from ledger.errors import DomainError
from ledger.roles import OPERATE, can, tenants_for

TEMPLATE = "console/cases.html"


def _label(resolution: str) -> str:
    return resolution.replace("_", " ").lower()


class ResolveForm(forms.Form):
    resolution = forms.ChoiceField(choices=[(r, _label(r)) for r in RESOLUTIONS])
    provider_request_id = forms.CharField(max_length=200, required=False, strip=True)
    reason = forms.CharField(max_length=500, strip=True)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("resolution") == "HAPPENED" and not data.get("provider_request_id"):
            self.add_error("provider_request_id", "HAPPENED needs the provider's request id as evidence.")
        return data


class ReasonForm(forms.Form):  # escalate and unclaim: a reason, nothing else
    reason = forms.CharField(max_length=500, strip=True)


class ReassignForm(forms.Form):
    to = forms.CharField(max_length=150, strip=True)
    reason = forms.CharField(max_length=500, strip=True)


class CommentForm(forms.Form):
    text = forms.CharField(max_length=COMMENT_MAX_LENGTH, strip=True)


class BulkForm(forms.Form):
    """One bulk action on the ticked cases (``case``) or on a case group (``group_*``, the
    group's key): resolve (one resolution and reason for all), claim, or escalate (one reason)."""

    action = forms.ChoiceField(choices=[(a, a) for a in BULK_ACTIONS], required=False)
    case = forms.TypedMultipleChoiceField(coerce=str, choices=(), required=False)
    resolution = forms.ChoiceField(choices=[(r, _label(r)) for r in BULK_RESOLUTIONS], required=False)
    reason = forms.CharField(max_length=500, strip=True, required=False)
    confirm = forms.BooleanField(required=False)
    group_tenant = forms.IntegerField(required=False)
    group_tool = forms.CharField(max_length=100, required=False, strip=False)
    group_provider = forms.CharField(max_length=100, required=False, strip=False)
    group_reason = forms.CharField(max_length=32, required=False, strip=False)
    group_verdict = forms.CharField(max_length=16, required=False, strip=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Any submitted id is a valid choice here; visibility is decided by the selector.
        field = self.fields["case"]
        if not isinstance(field, forms.TypedMultipleChoiceField):
            raise TypeError("BulkForm.case must be a multiple choice field")
        submitted = self.data.getlist("case") if isinstance(self.data, QueryDict) else []
        field.choices = [(v, v) for v in submitted]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["action"] = data.get("action") or "resolve"
        if not data.get("case") and data.get("group_tenant") is None:
            self.add_error("case", "Choose at least one case.")
        if data["action"] == "resolve" and not data.get("resolution"):
            self.add_error("resolution", "Choose a resolution.")
        if data["action"] != "claim" and not data.get("reason"):
            self.add_error("reason", "Say why (the evidence for all of them).")
        return data

    def group_key(self) -> dict[str, Any] | None:
        data = self.cleaned_data
        if data.get("group_tenant") is None:
            return None
        return {
            "tenant_id": data["group_tenant"],
            "tool": data["group_tool"],
            "provider": data["group_provider"],
            "reason": data["group_reason"],
            "verdict": data["group_verdict"],
        }


STATUS_LABELS = {
    "open": "waiting for people",
    "unclaimed": "unclaimed",
    "mine": "claimed by me",
    "LOOKUP": "with a reconciler",
    "unresolved": "all unresolved",
    "all": "all, resolved too",
}


def _queue_context(request: HtmxHttpRequest) -> dict[str, Any]:
    status, status_notice = chosen(request, "status", CASE_FILTERS, "open")
    sort, sort_notice = chosen(request, "sort", SORTS, "newest" if status in ("all", "RESOLVED") else "oldest")
    where = paging(request)
    page = case_queue(
        user=request.user, status=status, cursor=where.cursor, back=where.back, size=where.size, sort=sort
    )
    rows = page.rows
    operable = set(tenants_for(request.user, OPERATE).values_list("pk", flat=True))
    return {
        "rows": with_case_deadlines(rows),
        "next_cursor": page.next_cursor,
        "pager": pager(request, page, where, list_name="cases", total=page.total, capped=page.capped, noun="cases"),
        "status": status,
        "sort": sort,
        "sorts": SORTS,
        "notices": [n for n in (status_notice, sort_notice, where.notice) if n],
        "query": f"status={status}&sort={sort}&size={where.size}",
        "statuses": [(key, STATUS_LABELS.get(key, key.lower())) for key in CASE_FILTERS],
        "show_resolved": status in ("all", "RESOLVED"),
        "selectable": any(row.tenant_id in operable and row.status != "RESOLVED" for row in rows),
        "operable": operable,
        "can_operate": bool(operable),
        "resolutions": [(r, _label(r)) for r in RESOLUTIONS],
        "bulk_resolutions": [(r, _label(r)) for r in BULK_RESOLUTIONS],
    }


def _page_context(request: HtmxHttpRequest) -> dict[str, Any]:
    """The whole page's: the queue's, with the case groups above it."""
    return {**_queue_context(request), **case_groups(user=request.user), "group_action_cap": GROUP_ACTION_CAP}


@require_GET
@login_required
def queue(request: HtmxHttpRequest) -> HttpResponse:
    if request.htmx and request.htmx.target == "cases-table":
        return render(request, f"{TEMPLATE}#table", _queue_context(request))
    return render(request, TEMPLATE, _page_context(request))


def _case_to_act_on(request: HtmxHttpRequest, case_id: UUID) -> ReconciliationCase:
    """Another tenant's case is a 404; a case the user sees but may not act on, 403."""
    case = get_object_or_404(cases_for(request.user).select_related("tenant"), pk=case_id)
    if not can(request.user, case.tenant, OPERATE):
        raise PermissionDenied("your role on this tenant does not allow this action")
    return case


def _done(request: HtmxHttpRequest, message: str, *, error: bool = False, status: int = 200) -> HttpResponse:
    return queue_answer(
        request,
        template=TEMPLATE,
        context=lambda: _page_context(request),
        message=message,
        back_to=reverse("cases") + (f"?{request.GET.urlencode()}" if request.GET else ""),
        error=error,
        status=status,
    )


@require_POST
@login_required
def claim(request: HtmxHttpRequest, case_id: UUID) -> HttpResponse:
    case = _case_to_act_on(request, case_id)
    try:
        case_claim(case_id=case.pk, user=request.user)
    except DomainError as exc:
        return _done(request, exc.detail, error=True, status=exc.status)
    return _done(request, f"Case {str(case.pk)[:8]} claimed.")


def _act(
    request: HtmxHttpRequest,
    case_id: UUID,
    form_class: type[forms.Form],
    act: Callable[[UUID, dict[str, Any]], object],
    said: Callable[[str, dict[str, Any]], str],
) -> HttpResponse:
    """One action on one case: the case (404 / 403), its form (422), the service named by
    ``act(case_id, cleaned)`` (its refusal's status), then the toast ``said(short id, cleaned)``."""
    case = _case_to_act_on(request, case_id)
    form = form_class(request.POST)
    if not form.is_valid():
        return _done(request, form_errors(form), error=True, status=BAD_INPUT)
    try:
        act(case.pk, form.cleaned_data)
    except DomainError as exc:
        return _done(request, exc.detail, error=True, status=exc.status)
    return _done(request, said(str(case.pk)[:8], form.cleaned_data))


@require_POST
@login_required
def resolve(request: HtmxHttpRequest, case_id: UUID) -> HttpResponse:
    return _act(
        request,
        case_id,
        ResolveForm,
        lambda pk, data: case_resolve(
            case_id=pk,
            user=request.user,
            resolution=data["resolution"],
            reason=data["reason"],
            provider_request_id=data["provider_request_id"],
        ),
        lambda short, data: f"Case {short} resolved as {data['resolution']}.",
    )


@require_POST
@login_required
def escalate(request: HtmxHttpRequest, case_id: UUID) -> HttpResponse:
    return _act(
        request,
        case_id,
        ReasonForm,
        lambda pk, data: case_escalate(case_id=pk, user=request.user, reason=data["reason"]),
        lambda short, data: f"Case {short} escalated.",
    )


@require_POST
@login_required
def unclaim(request: HtmxHttpRequest, case_id: UUID) -> HttpResponse:
    return _act(
        request,
        case_id,
        ReasonForm,
        lambda pk, data: case_unclaim(case_id=pk, user=request.user, reason=data["reason"]),
        lambda short, data: f"Case {short} is unclaimed again.",
    )


@require_POST
@login_required
def reassign(request: HtmxHttpRequest, case_id: UUID) -> HttpResponse:
    return _act(
        request,
        case_id,
        ReassignForm,
        lambda pk, data: case_reassign(case_id=pk, user=request.user, to=data["to"], reason=data["reason"]),
        lambda short, data: f"Case {short} reassigned to {data['to']}.",
    )


@require_POST
@login_required
def comment(request: HtmxHttpRequest, case_id: UUID) -> HttpResponse:
    return _act(
        request,
        case_id,
        CommentForm,
        lambda pk, data: case_comment(case_id=pk, user=request.user, text=data["text"]),
        lambda short, data: f"Comment added to case {short}.",
    )


@require_POST
@login_required
def bulk(request: HtmxHttpRequest) -> HttpResponse:
    """One way to act on several cases, ticked ones or a case group's: the first POST (no
    ``confirm``) shows exactly the cases it will touch; the second, with ``confirm`` and
    those cases' ids, acts on exactly those, all or none."""
    form = BulkForm(request.POST)
    if not form.is_valid():
        return _done(request, form_errors(form), error=True, status=BAD_INPUT)
    data = form.cleaned_data
    action = data["action"]
    group = form.group_key()
    if group is not None:
        ids = group_case_ids(user=request.user, key=group)
        if not ids:
            raise Http404("case group not found")
    else:
        ids = data["case"]
    selected_for_action(request, cases_for(request.user), ids, OPERATE, "case")
    if not data["confirm"]:
        touched = cases_preview(case_ids=ids, user=request.user, action=action)
        preview = {
            "preview": touched,
            "skipped": len(ids) - len(touched),
            "action": action,
            "resolution": data["resolution"],
            "reason": data["reason"],
            "group": group,
            "group_capped": group is not None and len(ids) >= GROUP_ACTION_CAP,
        }
        return bulk_preview(request, TEMPLATE, preview, lambda: _page_context(request))
    try:
        done = _bulk_act(request, action, ids, data)
    except DomainError as exc:
        return _done(request, f"Nothing changed: {exc.detail}", error=True, status=exc.status)
    count = len(done)
    said = {"resolve": f"resolved as {data['resolution']}", "claim": "claimed", "escalate": "escalated"}[action]
    return _done(request, f"{count} case{pluralize(count)} {said}.")


def _bulk_act(request: HtmxHttpRequest, action: str, ids: list[str], data: dict[str, Any]) -> list[ReconciliationCase]:
    if action == "claim":
        return cases_claim_bulk(case_ids=ids, user=request.user)
    if action == "escalate":
        return cases_escalate_bulk(case_ids=ids, user=request.user, reason=data["reason"])
    return cases_resolve_bulk(case_ids=ids, user=request.user, resolution=data["resolution"], reason=data["reason"])
