"""The approval queue: what would happen, where, how often, until when, under which policy
version, bound to which args digest and fencing token; approve or deny with a reason.
Decisions go through approvals.services.approvals.approval_decide."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.models import ApprovalRequest
from approvals.selectors import APPROVAL_FILTERS, APPROVAL_SORTS, approval_queue, approvals_for
from approvals.services.approvals import approval_decide
from approvals.services.approvals_bulk import approvals_decide_bulk, approvals_preview
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
from ledger.roles import APPROVE, can, tenants_for

TEMPLATE = "console/approvals.html"


class DecideForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("deny", "deny")])
    reason = forms.CharField(max_length=500, strip=True)


class BulkDecideForm(DecideForm):
    approval = forms.TypedMultipleChoiceField(
        coerce=str, choices=(), error_messages={"required": "Choose at least one request."}
    )
    confirm = forms.BooleanField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Any submitted id is a valid choice here; what the user may decide is the service's.
        field = self.fields["approval"]
        if not isinstance(field, forms.TypedMultipleChoiceField):
            raise TypeError("BulkDecideForm.approval must be a multiple choice field")
        submitted = self.data.getlist("approval") if isinstance(self.data, QueryDict) else []
        field.choices = [(v, v) for v in submitted]


STATUS_LABELS = {"PENDING": "pending", "decided": "decided (any)", "all": "all"}
SORT_LABELS = {"expiring": "expiring first", "oldest": "asked longest ago first", "newest": "newest first"}


@dataclass(frozen=True)
class QueueRow:
    """One request as the queue shows it: its status as a person must read it, and the
    policy version it was asked under. The template reads the request's own fields
    (``a.pk``, ``a.operation``, ...) through the row."""

    approval: ApprovalRequest
    shown_status: str
    policy_version: int | None

    @classmethod
    def of(cls, approval: ApprovalRequest, now: datetime) -> "QueueRow":
        # A PENDING request past its expiry is EXPIRED whether or not the expiry job ran.
        expired = approval.status == "PENDING" and approval.expires_at <= now
        if approval.capability is not None:
            policy_version: int | None = approval.capability.policy_version
        else:
            policy_version = approval.operation.decision_policy_version if approval.operation is not None else None
        return cls(approval, "EXPIRED" if expired else approval.status, policy_version)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):  # copy and pickle look for hooks before the row is built
            raise AttributeError(name)
        return getattr(self.approval, name)


def _queue_context(request: HtmxHttpRequest) -> dict[str, Any]:
    status, status_notice = chosen(request, "status", APPROVAL_FILTERS, "PENDING")
    sort, sort_notice = chosen(request, "sort", APPROVAL_SORTS, "expiring")
    where = paging(request)
    found = approval_queue(
        user=request.user, status=status, cursor=where.cursor, back=where.back, size=where.size, sort=sort
    )
    page, next_cursor = found.rows, found.next_cursor
    now = timezone.now()
    rows = [QueueRow.of(approval, now) for approval in page]
    approvable = set(tenants_for(request.user, APPROVE).values_list("pk", flat=True))
    return {
        "rows": rows,
        "next_cursor": next_cursor,
        "status": status,
        "sort": sort,
        "notices": [n for n in (status_notice, sort_notice, where.notice) if n],
        "query": f"status={status}&sort={sort}&size={where.size}",
        "pager": pager(
            request, found, where, list_name="approvals", total=found.total, capped=found.capped, noun="requests"
        ),
        "statuses": [(key, STATUS_LABELS.get(key, key.lower())) for key in APPROVAL_FILTERS],
        "sorts": list(SORT_LABELS.items()),
        "approvable": approvable,
        "selectable": any(row.shown_status == "PENDING" and row.approval.tenant_id in approvable for row in rows),
        "now": now,
    }


@require_GET
@login_required
def queue(request: HtmxHttpRequest) -> HttpResponse:
    context = _queue_context(request)
    if request.htmx and request.htmx.target == "approvals-table":
        return render(request, f"{TEMPLATE}#table", context)
    return render(request, TEMPLATE, context)


def _done(request: HtmxHttpRequest, message: str, *, error: bool = False, status: int = 200) -> HttpResponse:
    return queue_answer(
        request,
        template=TEMPLATE,
        context=lambda: _queue_context(request),
        message=message,
        back_to=reverse("approvals") + (f"?{request.GET.urlencode()}" if request.GET else ""),
        error=error,
        status=status,
    )


@require_POST
@login_required
def decide(request: HtmxHttpRequest, approval_id: UUID) -> HttpResponse:
    """Another tenant's request is a 404; one the user sees but may not decide, 403."""
    approval = get_object_or_404(approvals_for(request.user).select_related("tenant"), pk=approval_id)
    if not can(request.user, approval.tenant, APPROVE):
        raise PermissionDenied("your role on this tenant does not allow this action")
    form = DecideForm(request.POST)
    if not form.is_valid():
        return _done(request, form_errors(form), error=True, status=BAD_INPUT)
    approve = form.cleaned_data["decision"] == "approve"
    try:
        approval_decide(approval_id=approval.pk, approve=approve, user=request.user, reason=form.cleaned_data["reason"])
    except DomainError as exc:
        return _done(request, exc.detail, error=True, status=exc.status)
    return _done(request, f"Request {str(approval.pk)[:8]} {'approved' if approve else 'denied'}.")


@require_POST
@login_required
def bulk(request: HtmxHttpRequest) -> HttpResponse:
    """First POST (no ``confirm``): the exact requests it will decide. Second POST with
    ``confirm``: decide exactly those, all or none."""
    form = BulkDecideForm(request.POST)
    if not form.is_valid():
        return _done(request, form_errors(form), error=True, status=BAD_INPUT)
    ids = form.cleaned_data["approval"]
    selected_for_action(request, approvals_for(request.user), ids, APPROVE, "approval")
    approve = form.cleaned_data["decision"] == "approve"
    touched = approvals_preview(approval_ids=ids, user=request.user)
    if not form.cleaned_data["confirm"]:
        preview = {
            "preview": touched,
            "skipped": len(set(ids)) - len(touched),
            "decision": form.cleaned_data["decision"],
            "reason": form.cleaned_data["reason"],
        }
        return bulk_preview(request, TEMPLATE, preview, lambda: _queue_context(request))
    try:
        decided = approvals_decide_bulk(
            approval_ids=ids, user=request.user, approve=approve, reason=form.cleaned_data["reason"]
        )
    except DomainError as exc:
        return _done(request, f"Nothing changed: {exc.detail}", error=True, status=exc.status)
    count = len(decided)
    return _done(request, f"{count} request{pluralize(count)} {'approved' if approve else 'denied'}.")
