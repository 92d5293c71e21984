"""Runs: the list with search, status and indicator filters (keyset pages), and one run's
page with its indicators, timeline, lease history, operations and budgets."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers

from console.views.common import BAD_INPUT, done, form_errors
from ledger import selectors
from ledger.actors import user_actor
from ledger.errors import DomainError
from ledger.roles import OPERATE, can
from ledger.services.core.decisions import acting_name
from ledger.services.fence.ending import run_cancel
from ledger.states import RunStatus

BADGE = {
    "COMPLETE": "ok",
    "VERIFIED": "ok",
    "OK": "ok",
    "CERTAIN": "ok",
    "UNSEALED": "info",
    "INCOMPLETE": "warn",
    "UNCERTAIN": "warn",
    "BROKEN": "bad",
    "MISMATCH": "bad",
}


def badges(run) -> list[dict]:
    """The four indicators as separate badges, in a fixed order, each with its reason."""
    return [
        {"name": name, "value": ind["value"], "tone": BADGE[ind["value"]], "reason": ind["reason"], "detail": ind}
        for name, ind in selectors.run_indicators(run).items()
    ]


def partial(request) -> bool:
    """An htmx swap gets the named partial; a history restore needs the whole page."""
    return bool(request.htmx) and not request.htmx.history_restore_request


@login_required
@vary_on_headers("HX-Request")
def run_list(request):
    params = request.GET
    chosen = {name: params.get(name, "") for name in selectors.INDICATOR_FILTERS}
    status = params.get("status", "")
    qs = selectors.runs_search(
        user=request.user,
        q=params.get("q", ""),
        status=status if status in RunStatus.values else "",
        indicators={k: v for k, v in chosen.items() if v},
    )
    rows, next_cursor = selectors.runs_page(qs, before=params.get("before", ""))
    query = params.copy()
    query.pop("before", None)
    context = {
        "rows": [{"run": run, "badges": badges(run)} for run in rows],
        "next_cursor": next_cursor,
        "paged": bool(params.get("before")),
        "base_query": query.urlencode(),
        "q": params.get("q", ""),
        "status": status,
        "statuses": RunStatus.values,
        "filters": [
            {"name": name, "values": list(values), "chosen": chosen[name]}
            for name, values in selectors.INDICATOR_FILTERS.items()
        ],
    }
    template = "console/runs_list.html#table" if partial(request) else "console/runs_list.html"
    return render(request, template, context)


def _detail_context(request, run, **extra) -> dict:
    try:
        after = max(int(request.GET.get("after", 0)), 0)
    except ValueError:
        after = 0
    events, next_after = selectors.run_events_page(run=run, after=after)
    return {
        "run": run,
        "badges": badges(run),
        "can_cancel": run.status == RunStatus.ACTIVE and can(request.user, run.tenant, OPERATE),
        "events": events,
        "after": after,
        "next_after": next_after,
        "now": timezone.now(),
        "liveness": selectors.run_liveness(run=run),
        **selectors.run_detail_parts(run=run),
        **extra,
    }


def _visible_run(request, run_id):
    qs = selectors.runs_for_user(user=request.user).select_related("tenant", "lease", "lease__worker")
    return get_object_or_404(qs, pk=run_id)


@login_required
@vary_on_headers("HX-Request")
def run_detail(request, run_id):
    run = _visible_run(request, run_id)
    template = "console/run_detail.html#timeline" if partial(request) else "console/run_detail.html"
    return render(request, template, _detail_context(request, run))


class CancelForm(forms.Form):
    reason = forms.CharField(max_length=500, strip=True)


@require_POST
@login_required
def run_cancel_view(request, run_id):
    """An operator or admin cancels a run (and its children) with a reason; another
    tenant's run is a 404, a role without OPERATE 403."""
    run = _visible_run(request, run_id)
    if not can(request.user, run.tenant, OPERATE):
        raise PermissionDenied("your role on this tenant does not allow this action")
    form = CancelForm(request.POST)
    if not form.is_valid():
        context = _detail_context(request, run, cancel_error=form_errors(form))
        return render(request, "console/run_detail.html", context, status=BAD_INPUT)
    try:
        name = acting_name(user=request.user, name="", tenant_id=run.tenant_id, perm=OPERATE)
        run = run_cancel(tenant=run.tenant, run_id=run.pk, reason=form.cleaned_data["reason"], actor=user_actor(name))
    except DomainError as exc:
        return render(
            request,
            "console/run_detail.html",
            _detail_context(request, run, cancel_error=exc.detail),
            status=exc.status,
        )
    if run.status == RunStatus.CANCELLING:
        message = f"Run is CANCELLING: its in-flight effects may report until {run.cancel_grace_until:%H:%M:%S} UTC."
    else:
        message = f"Run is {run.status}."
    return done(request, message, f"/runs/{run.pk}/")
