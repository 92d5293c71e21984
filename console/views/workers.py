"""Workers: their status, leases held and lost (restart episodes); drain with a deadline,
quarantine (held leases end now), resume. Writes go through ledger.services.workers,
which re-checks the admin role."""

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.template.defaultfilters import pluralize
from django.views.decorators.http import require_GET, require_POST

from approvals import selectors as approvals_selectors
from console.views.common import BAD_INPUT, HtmxHttpRequest, done, form_errors, next_url
from ledger import admin_selectors
from ledger.errors import DomainError
from ledger.roles import ADMINISTER, DIAGNOSTICS, VIEW, can, tenants_for
from ledger.services.fleet.lifecycle import (
    DEFAULT_DRAIN_S,
    MAX_DRAIN_S,
    TRANSITIONS,
    worker_change,
    workers_drain_bulk,
    workers_drain_preview,
)
from ledger.states import WorkerStatus

TEMPLATE = "console/workers.html"
DETAIL_TEMPLATE = "console/worker_detail.html"


class ActionForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in TRANSITIONS])
    reason = forms.CharField(max_length=500, strip=True)
    deadline_min = forms.IntegerField(min_value=1, max_value=MAX_DRAIN_S // 60, required=False)


class BulkDrainForm(forms.Form):
    worker = forms.TypedMultipleChoiceField(
        coerce=str, choices=(), error_messages={"required": "Choose at least one worker."}
    )
    reason = forms.CharField(max_length=500, strip=True)
    deadline_min = forms.IntegerField(min_value=1, max_value=MAX_DRAIN_S // 60, required=False)
    confirm = forms.BooleanField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["worker"]
        if not isinstance(field, forms.TypedMultipleChoiceField):
            raise TypeError("BulkDrainForm.worker must be a multiple choice field")
        submitted = self.data.getlist("worker") if isinstance(self.data, QueryDict) else []
        field.choices = [(v, v) for v in submitted]


def _list_context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    tenant, status = request.GET.get("tenant", "").strip(), request.GET.get("status", "").strip()
    return {
        "rows": admin_selectors.worker_list(user=request.user, tenant=tenant, status=status),
        "filters": {"tenant": tenant, "status": status},
        "statuses": WorkerStatus.values,
        "tenants": list(tenants_for(request.user, VIEW).order_by("slug")),
        "administrable": set(tenants_for(request.user, ADMINISTER).values_list("pk", flat=True)),
        "default_drain_min": DEFAULT_DRAIN_S // 60,
        **extra,
    }


@require_GET
@login_required
def worker_list(request: HtmxHttpRequest) -> HttpResponse:
    context = _list_context(request)
    if request.htmx and not request.htmx.history_restore_request and request.htmx.target == "workers-table":
        return render(request, f"{TEMPLATE}#table", context)
    return render(request, TEMPLATE, context)


@require_GET
@login_required
def worker_detail(request: HtmxHttpRequest, worker_id: int) -> HttpResponse:
    worker = get_object_or_404(admin_selectors.workers_for(user=request.user), pk=worker_id)
    context = {
        "worker": worker,
        "can_administer": can(request.user, worker.tenant, ADMINISTER),
        "default_drain_min": DEFAULT_DRAIN_S // 60,
        "liveness": approvals_selectors.worker_liveness(worker=worker),
        **admin_selectors.worker_detail_parts(worker=worker),
    }
    # The diagnostic plane (ledger.roles.DIAGNOSTICS): a quarantine's bundle and the boots'
    # error messages are for the tenant's operators and admins, not its viewers.
    context["show_diagnostics"] = can(request.user, worker.tenant, DIAGNOSTICS)
    if not context["show_diagnostics"]:
        context["bundle"] = None
    return render(request, DETAIL_TEMPLATE, context)


@require_POST
@login_required
def worker_act(request: HtmxHttpRequest, worker_id: int) -> HttpResponse:
    """Another tenant's worker is a 404; one the user sees but may not administer, 403."""
    worker = get_object_or_404(admin_selectors.workers_for(user=request.user), pk=worker_id)
    if not can(request.user, worker.tenant, ADMINISTER):
        raise PermissionDenied("your role on this tenant does not allow this action")
    form = ActionForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _list_context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    action, reason = form.cleaned_data["action"], form.cleaned_data["reason"]
    deadline_s = (form.cleaned_data["deadline_min"] or DEFAULT_DRAIN_S // 60) * 60
    try:
        changed = worker_change(
            worker_id=worker.pk, action=action, reason=reason, deadline_s=deadline_s, user=request.user
        )
    except DomainError as exc:
        return render(request, TEMPLATE, _list_context(request, errors=[exc.detail]), status=exc.status)
    held = len(changed.affected_run_ids)
    message = f"{worker.name} is {changed.worker.status}."
    if action == "quarantine" and held:
        message += (
            f" {held} lease{pluralize(held)} it held {pluralize(held, 'was,were')} revoked; anything dispatched "
            f"under {pluralize(held, 'it,them')} is now UNKNOWN."
        )
    elif action == "drain":
        deadline = f"{changed.worker.drain_deadline:%H:%M:%S} UTC"
        if held:
            message += f" It may finish its {held} run{pluralize(held)} until {deadline}; it takes no new ones."
        else:
            message += " It holds no runs and takes no new ones."
    return done(request, message, next_url(request, "/workers/"))


@require_POST
@login_required
def bulk_drain(request: HtmxHttpRequest) -> HttpResponse:
    """First POST: the exact workers it will drain. Second POST with ``confirm``: drain
    exactly those, all or none."""
    form = BulkDrainForm(request.POST)
    if not form.is_valid():
        return render(request, TEMPLATE, _list_context(request, errors=[form_errors(form)]), status=BAD_INPUT)
    ids = form.cleaned_data["worker"]
    visible = admin_selectors.workers_for(user=request.user).filter(pk__in=[i for i in ids if i.isdigit()])
    if visible.count() != len(set(ids)):
        raise Http404("worker not found")
    if any(not can(request.user, w.tenant, ADMINISTER) for w in visible.select_related("tenant")):
        raise PermissionDenied("your role on this tenant does not allow this action")
    deadline_min = form.cleaned_data["deadline_min"] or DEFAULT_DRAIN_S // 60
    if not form.cleaned_data["confirm"]:
        preview = workers_drain_preview(worker_ids=ids, user=request.user)
        context = _list_context(
            request,
            preview=preview,
            skipped=len(set(ids)) - len(preview),
            reason=form.cleaned_data["reason"],
            deadline_min=deadline_min,
        )
        return render(request, f"{TEMPLATE}#bulk-preview" if request.htmx else TEMPLATE, context)
    try:
        changed = workers_drain_bulk(
            worker_ids=ids, user=request.user, reason=form.cleaned_data["reason"], deadline_s=deadline_min * 60
        )
    except DomainError as exc:
        return done(request, f"Nothing changed: {exc.detail}", "/workers/", error=True)
    return done(
        request,
        f"{len(changed)} worker{pluralize(len(changed))} draining, for at most {deadline_min} min.",
        "/workers/",
    )
