"""Runs: the list with search, status and indicator filters (keyset pages), and one run's
page with its indicators, timeline, lease history, operations and budgets."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.views.decorators.vary import vary_on_headers

from ledger import selectors
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


@login_required
@vary_on_headers("HX-Request")
def run_detail(request, run_id):
    qs = selectors.runs_for_user(user=request.user).select_related("tenant", "lease", "lease__worker")
    run = get_object_or_404(qs, pk=run_id)
    try:
        after = max(int(request.GET.get("after", 0)), 0)
    except ValueError:
        after = 0
    events, next_after = selectors.run_events_page(run=run, after=after)
    context = {
        "run": run,
        "badges": badges(run),
        "events": events,
        "after": after,
        "next_after": next_after,
        **selectors.run_detail_parts(run=run),
    }
    template = "console/run_detail.html#timeline" if partial(request) else "console/run_detail.html"
    return render(request, template, context)
