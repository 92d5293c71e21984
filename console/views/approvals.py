"""The approval queue: what would happen, where, how often, until when, under which policy
version, bound to which args digest and fencing token; approve or deny with a reason.
Decisions go through approvals.services.approvals.approval_decide."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.selectors import APPROVAL_FILTERS, approval_queue, approvals_for
from approvals.services.approvals import approval_decide
from console.views.common import BAD_INPUT, form_errors, queue_answer
from ledger.errors import DomainError
from ledger.roles import APPROVE, can, tenants_for

TEMPLATE = "console/approvals.html"


class DecideForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("deny", "deny")])
    reason = forms.CharField(max_length=500, strip=True)


def _queue_context(request) -> dict:
    status = request.GET.get("status", "PENDING")
    if status not in APPROVAL_FILTERS:
        status = "PENDING"
    rows, next_cursor = approval_queue(user=request.user, status=status, cursor=request.GET.get("after"))
    now = timezone.now()
    for row in rows:
        # A PENDING request past its expiry is EXPIRED whether or not the expiry job ran.
        row.shown_status = "EXPIRED" if row.status == "PENDING" and row.expires_at <= now else row.status
        row.policy_version = (
            row.capability.policy_version
            if row.capability_id
            else (row.operation.decision_policy_version if row.operation_id else None)
        )
    approvable = set(tenants_for(request.user, APPROVE).values_list("pk", flat=True))
    return {
        "rows": rows,
        "next_cursor": next_cursor,
        "status": status,
        "statuses": list(APPROVAL_FILTERS),
        "approvable": approvable,
        "now": now,
    }


@require_GET
@login_required
def queue(request):
    context = _queue_context(request)
    if request.htmx and request.htmx.target == "approvals-table":
        return render(request, f"{TEMPLATE}#table", context)
    return render(request, TEMPLATE, context)


def _done(request, message: str, *, error: bool = False, status: int = 200):
    return queue_answer(
        request,
        template=TEMPLATE,
        context=lambda: _queue_context(request),
        message=message,
        back_to="approvals",
        error=error,
        status=status,
    )


@require_POST
@login_required
def decide(request, approval_id):
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
