"""Runs: the list with search, status and indicator filters (keyset pages), and one run's
page with its indicators, timeline, lease history, operations, budgets and, for the run of
an MCP session (``fenceline-mcp``), the session: its client, protocol and upstreams."""

from typing import Any, TypedDict
from uuid import UUID

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from django.template.defaultfilters import pluralize
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from approvals import selectors as approvals_selectors
from approvals.run_axis import run_time_axis
from console.views.common import BAD_INPUT, HtmxHttpRequest, chosen, done, form_errors
from console.views.paging import POSITION, pager, paging
from fenceline_client.evidence_verifier import Report
from ledger import selectors
from ledger.actors import user_actor
from ledger.errors import ApprovalRequired, DomainError, KeyUnavailable, NotFound
from ledger.models import Run
from ledger.roles import ADMINISTER, DIAGNOSTICS, OPERATE, can, tenants_for
from ledger.services.core.decisions import acting_name
from ledger.services.evidence.export import chain_export
from ledger.services.evidence.verification import run_verify
from ledger.services.fence.ending import run_cancel
from ledger.services.fence.leases import lease_force_release
from ledger.services.fence.retry import operation_retry_by_admin
from ledger.states import EffectClass, Phase, RunStatus

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


def badges(run: Run) -> list[dict[str, Any]]:
    """The four indicators as separate badges, in a fixed order, each with its reason."""
    return [
        {"name": name, "value": ind["value"], "tone": BADGE[ind["value"]], "reason": ind["reason"], "detail": ind}
        for name, ind in selectors.run_indicators(run).items()
    ]


def partial(request: HtmxHttpRequest) -> bool:
    """An htmx swap gets the named partial; a history restore needs the whole page."""
    return bool(request.htmx) and not request.htmx.history_restore_request


SORTS = ("newest", "oldest")


class RunFilters(TypedDict):
    """What the run list is narrowed to (``ledger.selectors.runs_search``'s arguments)."""

    q: str
    status: str
    indicators: dict[str, str]
    tenant: str
    worker: str
    tool: str
    effect_class: str
    phase: str
    stuck: bool


def _run_filters(request: HtmxHttpRequest) -> tuple[RunFilters, str, list[str]]:
    """The list's filters and order from the query string, each value matched in any case;
    a value that is none of the allowed ones is dropped with a notice (never silently)."""
    notices = []
    status, notice = chosen(request, "status", RunStatus.values, "")
    notices.append(notice)
    indicators: dict[str, str] = {}
    for name, values in selectors.INDICATOR_FILTERS.items():
        indicators[name], notice = chosen(request, name, list(values), "")
        notices.append(notice)
    tenant, notice = chosen(request, "tenant", list(tenants_for(request.user).values_list("slug", flat=True)), "")
    notices.append(notice)
    effect_class, notice = chosen(request, "class", EffectClass.values, "")
    notices.append(notice)
    phase, notice = chosen(request, "phase", Phase.values, "")
    notices.append(notice)
    sort, notice = chosen(request, "sort", SORTS, "newest")
    notices.append(notice)
    stuck, notice = chosen(request, "stuck", ("yes",), "")
    notices.append(notice)
    filters = RunFilters(
        q=request.GET.get("q", "").strip()[:200],
        status=status,
        indicators=indicators,
        tenant=tenant,
        worker=request.GET.get("worker", "").strip()[:200],
        tool=request.GET.get("tool", "").strip()[:100],
        effect_class=effect_class,
        phase=phase,
        stuck=stuck == "yes",
    )
    return filters, sort, [n.replace("There is no status", "There is no run status") for n in notices if n]


@login_required
@vary_on_headers("HX-Request")
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    params = request.GET
    filters, sort, notices = _run_filters(request)
    searched: RunFilters = {**filters, "indicators": {k: v for k, v in filters["indicators"].items() if v}}
    qs = selectors.runs_search(user=request.user, **searched)
    where = paging(request, cursor_param="before")
    found = selectors.runs_page(
        qs, before=where.cursor or "", back=where.back or "", size=where.size, oldest_first=sort == "oldest"
    )
    query = params.copy()
    for name in POSITION:
        query.pop(name, None)
    stuck = selectors.runs_stuck_flags(found.rows)
    context = {
        "rows": [{"run": run, "badges": badges(run), "stuck": stuck.get(run.pk)} for run in found.rows],
        "next_cursor": found.next_cursor,
        "page": where.number,
        "pager": pager(
            request,
            found,
            where,
            list_name="runs",
            cursor_param="before",
            total=found.total,
            capped=found.capped,
            noun="runs",
        ),
        "paged": bool(where.cursor or where.back),
        "base_query": query.urlencode(),
        "notices": [*notices, *([where.notice] if where.notice else [])],
        "search_help": selectors.SEARCH_HELP,
        "sort": sort,
        "sorts": SORTS,
        **filters,
        "statuses": RunStatus.values,
        "classes": EffectClass.values,
        "phases": Phase.values,
        "tenants": _visible_slugs(request.user),
        "filters": [
            {"name": name, "values": list(values), "chosen": filters["indicators"][name]}
            for name, values in selectors.INDICATOR_FILTERS.items()
        ],
    }
    template = "console/runs_list.html#table" if partial(request) else "console/runs_list.html"
    return render(request, template, context)


def _visible_slugs(user: User | AnonymousUser) -> list[str]:
    return list(tenants_for(user).order_by("slug").values_list("slug", flat=True))


def _detail_context(request: HtmxHttpRequest, run: Run, **extra: Any) -> dict[str, Any]:
    try:
        after = max(int(request.GET.get("after", 0)), 0)
    except ValueError:
        after = 0
    events, next_after = selectors.run_events_page(run=run, after=after)
    return {
        "run": run,
        "badges": badges(run),
        "can_cancel": run.status == RunStatus.ACTIVE and can(request.user, run.tenant, OPERATE),
        "can_fix": can(request.user, run.tenant, ADMINISTER),
        "stuck": selectors.runs_stuck_flags([run]).get(run.pk),
        "can_verify": can(request.user, run.tenant, OPERATE),
        "can_read_payloads": can(request.user, run.tenant, DIAGNOSTICS),
        "checkpoint_every": settings.FENCELINE["CHECKPOINT_EVERY"],
        "events": events,
        "after": after,
        "next_after": next_after,
        "now": timezone.now(),
        "liveness": approvals_selectors.run_liveness(run=run),
        **selectors.run_detail_parts(run=run),
        "operations": approvals_selectors.run_operations(run=run),
        "mcp": selectors.run_mcp_session(run=run),
        **extra,
    }


def _visible_run(request: HtmxHttpRequest, run_id: UUID) -> Run:
    qs = selectors.runs_for_user(user=request.user).select_related("tenant", "lease", "lease__worker")
    return get_object_or_404(qs, pk=run_id)


@login_required
@vary_on_headers("HX-Request")
def run_detail(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """The run's page. htmx asks it for the next page of the timeline (``after``) and, every
    few seconds while the page is open, for what changed (``live``: the events seen when the
    page was opened): the indicators, the lease and the operations swapped in place, and a
    marker of the events that arrived since."""
    run = _visible_run(request, run_id)
    if partial(request) and "live" in request.GET:
        try:
            seen = max(int(request.GET["live"]), 0)
        except ValueError:
            seen = run.last_seq
        context = _detail_context(request, run, seen=seen, new_events=max(run.last_seq - seen, 0), oob=True)
        return render(request, "console/run_detail.html#live", context)
    if partial(request):
        return render(
            request, "console/run_detail.html#timeline", _detail_context(request, run, seen=run.last_seq, new_events=0)
        )
    context = _detail_context(request, run, seen=run.last_seq, new_events=0)
    context["axis"] = run_time_axis(
        run=run, operations=context["operations"], grants=context["grants"], now=context["now"]
    )
    return render(request, "console/run_detail.html", context)


@login_required
def run_export(request: HtmxHttpRequest, run_id: UUID) -> StreamingHttpResponse:
    """The run's chain as the worker API exports it, to check with the standalone verifier."""
    run = _visible_run(request, run_id)
    readable = can(request.user, run.tenant, DIAGNOSTICS)  # a viewer's export withholds the payloads
    response = StreamingHttpResponse(chain_export(run, payloads=readable), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-chain.json"'
    return response


@login_required
def event_payload(request: HtmxHttpRequest, run_id: UUID, seq: int) -> JsonResponse:
    """The diagnostic payload the event at ``seq`` commits to by digest, as JSON: for the
    tenant's operators and admins only (403 for a viewer; 404 when there is none)."""
    run = _visible_run(request, run_id)
    try:
        kept = selectors.diagnostic_payload(user=request.user, run=run, seq=seq)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    except KeyUnavailable as exc:
        return JsonResponse(exc.body(), status=exc.status)
    return JsonResponse(kept, json_dumps_params={"ensure_ascii": False})


@require_POST
@login_required
def run_verify_now(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """Verify the run's chain now (and seal what holds), as the verifier job would; an
    operator's or admin's action (it writes checkpoints)."""
    run = _visible_run(request, run_id)
    if not can(request.user, run.tenant, OPERATE):
        raise PermissionDenied("your role on this tenant does not allow this action")
    report = run_verify(run_id=run.pk)
    if report.finding is None:
        return done(request, _verified(report), f"/runs/{run.pk}/")
    finding = report.finding
    return done(request, f"BROKEN at seq {finding.first_seq}: {finding.reason}.", f"/runs/{run.pk}/", error=True)


def _verified(report: Report) -> str:
    """What a clean verification found, in words: every event holds; sealed to the head, or
    the events past the last checkpoint wait for the next one (normal while a run is active)."""
    checked = f"Verified {report.events_checked:,} event{pluralize(report.events_checked)}: every hash and link holds"
    sealed = report.last_trusted_checkpoint or 0
    if report.status == "VERIFIED":
        return f"{checked}, sealed up to the latest (seq {report.head_seq})."
    waiting = report.head_seq - sealed
    where = f"sealed up to seq {sealed}" if sealed else "none sealed yet"
    return (
        f"{checked}; {where}, the {waiting} after it wait for the next checkpoint "
        "(UNSEALED: normal while a run is active)."
    )


class CancelForm(forms.Form):
    reason = forms.CharField(max_length=500, strip=True)


@require_POST
@login_required
def run_cancel_view(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
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


# --- an admin's run-level fixes (issue 40): each previewed, then confirmed ----------------


def _admin_run(request: HtmxHttpRequest, run_id: UUID) -> Run:
    """The run, for a user with the admin role on its tenant: 404 when they cannot see it,
    403 when they see it but may not act."""
    run = _visible_run(request, run_id)
    if not can(request.user, run.tenant, ADMINISTER):
        raise PermissionDenied("only an admin of this tenant may force-release a lease or retry an operation")
    return run


class ForceReleaseForm(forms.Form):
    reason = forms.CharField(max_length=500, strip=True)
    fencing_token = forms.IntegerField(min_value=0)


@require_http_methods(["GET", "POST"])
@login_required
@vary_on_headers("HX-Request")
def run_force_release_view(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """GET: what a force-release of the run's lease will do (its holder, token, the
    DISPATCHED operations that become UNKNOWN with a case each); htmx gets the fragment.
    POST: do it, for the token the preview showed (a lease that changed hands since is
    refused), with the admin's reason."""
    run = _admin_run(request, run_id)
    error, status = "", 200
    if request.method == "POST":
        form = ForceReleaseForm(request.POST)
        if form.is_valid():
            try:
                ended = lease_force_release(
                    user=request.user,
                    run_id=run.pk,
                    fencing_token=form.cleaned_data["fencing_token"],
                    reason=form.cleaned_data["reason"],
                )
            except DomainError as exc:
                error, status = exc.detail, exc.status
            else:
                moved = ended.operations_unknown
                return done(
                    request,
                    f"Lease of {ended.owner_id} (token {ended.fencing_token}) released: "
                    f"{moved} dispatched operation{pluralize(moved)} now UNKNOWN with a case{pluralize(moved)}.",
                    f"/runs/{run.pk}/",
                )
        else:
            error, status = form_errors(form), BAD_INPUT
        run = _visible_run(request, run_id)  # as it is now
    context = {"run": run, "preview": selectors.force_release_preview(run=run), "error": error}
    template = "console/run_force_release.html" + ("#preview" if partial(request) else "")
    return render(request, template, context, status=status)


class RetryForm(forms.Form):
    reason = forms.CharField(max_length=500, strip=True)


@require_http_methods(["GET", "POST"])
@login_required
@vary_on_headers("HX-Request")
def operation_retry_view(request: HtmxHttpRequest, run_id: UUID, operation_id: UUID) -> HttpResponse:
    """GET: what a retry of the operation will do (the retry decision; for a NON_RETRYABLE
    one, an approval asked first); htmx gets the fragment. POST: do it with the admin's
    reason: a new attempt PLANNED, or the approval asked (or used, once approved)."""
    run = _admin_run(request, run_id)
    try:
        preview = selectors.operation_retry_preview(run=run, operation_id=operation_id)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    error, status = "", 200
    if request.method == "POST":
        form = RetryForm(request.POST)
        if form.is_valid():
            try:
                op = operation_retry_by_admin(
                    user=request.user, operation_id=operation_id, reason=form.cleaned_data["reason"]
                )
            except ApprovalRequired as asked:
                return done(
                    request,
                    f"Sent to the approvers (approval {str(asked.approval_id)[:8]}): once approved, retry again here "
                    "or let the worker's retry use it.",
                    f"/runs/{run.pk}/#op-{operation_id}",
                )
            except DomainError as exc:
                error, status = exc.detail, exc.status
            else:
                return done(
                    request,
                    f"Attempt {op.attempt} of {op.tool} · {op.action} is PLANNED: the lease holder's replay of its "
                    "intent (same idempotency key) takes it from here.",
                    f"/runs/{run.pk}/#op-{op.pk}",
                )
        else:
            error, status = form_errors(form), BAD_INPUT
        run = _visible_run(request, run_id)
        preview = selectors.operation_retry_preview(run=run, operation_id=operation_id)
    context = {"run": run, "preview": preview, "error": error}
    template = "console/operation_retry.html" + ("#preview" if partial(request) else "")
    return render(request, template, context, status=status)
