"""Reads, scoped to a tenant (worker API) or a user (console).

What a read needs of the people's queues (reconciliation cases, approval requests) is read by
the approvals app, above this one: ``approvals/selectors.py`` composes the console's reads of
cases and approvals with these, and the worker API reaches the cases through
``ledger.services.core.handoff``."""

import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.utils import timezone

from ledger.errors import NotFound, parse_id
from ledger.models import (
    RUN_UNCERTAIN,
    CapabilityBudget,
    CostWindow,
    CredentialLease,
    DiagnosticPayload,
    EffectDelivery,
    Event,
    LeaseGrant,
    Operation,
    ProgressCheckpoint,
    Run,
    RunLease,
    RunResource,
    Tenant,
    Worker,
)
from ledger.observability.stuck import Stuck, stuck_condition, stuck_counts, stuck_limits, stuck_reason
from ledger.pagination import Page, keyset_page
from ledger.roles import DIAGNOSTICS, can, tenants_for
from ledger.services.core.handoff import UnknownTime
from ledger.services.delivery.lookup import delivery_refuses_retry
from ledger.services.evidence.append import phase_count_field
from ledger.services.evidence.planes import opened
from ledger.services.fence.retry import operation_retry_decision
from ledger.services.fleet.workers import token_digest
from ledger.sql import rows as sql_rows
from ledger.sql.reads import CappedCount
from ledger.states import RUN_FINISHED


def worker_for_token(token: str) -> Worker | None:
    """The worker (with its tenant) whose token this is: every worker request asks, so the
    statement is pre-built (``ledger.sql.rows``), not compiled each time. token_hash is unique."""
    worker = sql_rows.get(Worker, ("tenant",), token_hash=token_digest(token))
    return worker if isinstance(worker, Worker) else None


def run_get(*, tenant: Tenant, run_id: object) -> Run:
    """A run of ``tenant`` with its lease, by pre-built statements (the worker API's read;
    compiling the queryset cost more than the rest of the request)."""
    run = sql_rows.get(Run, tenant_id=tenant.pk, id=parse_id(run_id, "run"))
    if run is None:
        raise NotFound("run not found")
    lease = sql_rows.get(RunLease, run_id=run.pk)
    if lease is not None:  # every run has one (run_create writes both)
        run.lease = lease
    return run


def operation_get(*, tenant: Tenant, operation_id: object) -> Operation:
    """An operation of ``tenant`` (the worker API's read: a pre-built statement, not a queryset
    compiled per request, which cost more than the rest of the request)."""
    op = sql_rows.get(Operation, tenant_id=tenant.pk, id=parse_id(operation_id, "operation"))
    if op is None:
        raise NotFound("operation not found")
    return op


def operation_delivery(*, operation: Operation) -> EffectDelivery | None:
    """The delivery evidence of the operation's current attempt, if any was recorded."""
    return EffectDelivery.objects.filter(operation_id=operation.pk, attempt=operation.attempt).first()


def resource_get(*, tenant_id: int, resource_id: object) -> RunResource:
    """A resource of the tenant (NotFound: another tenant's)."""
    return RunResource.objects.of_tenant(tenant_id, resource_id)


# One indicator: its value, the evidence behind it and a reason when it is not green (JSON).
type Indicator = dict[str, Any]


def run_indicators(run: Run) -> dict[str, Indicator]:
    """The four indicators, each with its value, its evidence and a reason when not green.
    Read from counters the transitions keep and from the verifier's last result: O(1)."""
    return {
        "completeness": _completeness(run),
        "integrity": _integrity(run),
        "authorization": _authorization(run),
        "certainty": _certainty(run),
    }


def _completeness(run: Run) -> Indicator:
    """COMPLETE, or INCOMPLETE: events are missing, or the run finished with effects open."""
    open_at_completion = run.n_dispatched + run.n_unknown
    if run.broken_reason == "gap":
        return {
            "value": "INCOMPLETE",
            "reason": f"events {run.broken_first_seq}..{run.broken_last_seq} are missing",
        }
    if run.status in RUN_FINISHED and open_at_completion:
        return {
            "value": "INCOMPLETE",
            "reason": f"{open_at_completion} dispatched effect(s) had no terminal outcome at completion",
        }
    return {"value": "COMPLETE", "reason": None}


def _integrity(run: Run) -> Indicator:
    """BROKEN (where the verifier found it), VERIFIED to the head, or UNSEALED past the last
    checkpoint."""
    if run.broken_reason:
        return {
            "value": "BROKEN",
            "first_bad_seq": run.broken_first_seq,
            "last_bad_seq": run.broken_last_seq,
            "reason": f"{run.broken_reason} at seq {run.broken_first_seq}..{run.broken_last_seq}: {run.broken_detail}",
        }
    if run.verified_checkpoint_seq is not None and run.verified_checkpoint_seq == run.last_seq:
        return {"value": "VERIFIED", "checkpoint_seq": run.verified_checkpoint_seq, "reason": None}
    sealed = run.verified_checkpoint_seq
    return {
        "value": "UNSEALED",
        "checkpoint_seq": sealed,
        "reason": (
            f"head seq {run.last_seq} is beyond the last checkpoint ({sealed})"
            if sealed
            else f"no checkpoint yet for head seq {run.last_seq}"
        ),
    }


def _authorization(run: Run) -> Indicator:
    """OK, or MISMATCH: effects dispatched that their authorization did not cover."""
    if run.authorization_mismatches:
        return {
            "value": "MISMATCH",
            "mismatches": run.authorization_mismatches,
            "reason": run.authorization_detail,
        }
    return {"value": "OK", "mismatches": 0, "reason": None}


def _certainty(run: Run) -> Indicator:
    """CERTAIN, or UNCERTAIN while some outcome is UNKNOWN or in flight; with the counts."""
    in_flight = run.n_dispatched
    counts = {
        "confirmed": run.n_confirmed,
        "unknown": run.n_unknown,
        "reconciled": run.n_reconciled,
        "failed": run.n_failed,
        "in_flight": in_flight,
        "intended_only": run.n_planned + run.n_pending_approval + run.n_authorized,
    }
    if run.n_unknown or in_flight:
        return {
            "value": "UNCERTAIN",
            "counts": counts,
            "reason": f"{run.n_unknown} UNKNOWN, {in_flight} dispatched without an outcome yet",
        }
    return {"value": "CERTAIN", "counts": counts, "reason": None}


# --- console reads, scoped to a user (every queryset is restricted to tenants_for(user)) ---

RUN_PAGE = 50
EVENT_PAGE = 50
EXPIRING_WITHIN_S = 60
# The dashboard counts what needs a person up to this many per tenant and then says "1000+":
# counting every one of 100,000 open cases read all of them (35 ms at 1M runs).
DASHBOARD_COUNT_CAP = 1000

# Each indicator's values as conditions on the run's own columns (built when asked for).
INDICATOR_FILTERS: dict[str, dict[str, Callable[[], Q]]] = {
    "completeness": {
        "COMPLETE": lambda: ~_incomplete(),
        "INCOMPLETE": lambda: _incomplete(),
    },
    "integrity": {
        "BROKEN": lambda: ~Q(broken_reason=""),
        "VERIFIED": lambda: Q(broken_reason="", verified_checkpoint_seq=F("last_seq")),
        "UNSEALED": lambda: (
            Q(broken_reason="") & (Q(verified_checkpoint_seq__isnull=True) | ~Q(verified_checkpoint_seq=F("last_seq")))
        ),
    },
    "authorization": {
        "OK": lambda: Q(authorization_mismatches=0),
        "MISMATCH": lambda: Q(authorization_mismatches__gt=0),
    },
    "certainty": {
        "CERTAIN": lambda: Q(n_unknown=0, n_dispatched=0),
        "UNCERTAIN": lambda: RUN_UNCERTAIN,
    },
}


def _incomplete() -> Q:
    return Q(broken_reason="gap") | Q(status="COMPLETED", n_dispatched__gt=0) | Q(status="COMPLETED", n_unknown__gt=0)


def runs_for_user(*, user: User | AnonymousUser) -> QuerySet[Run]:
    """Runs of the tenants on which ``user`` may view (none without a role). The tenant ids
    are read first (one small query) so that the runs query is a plain ``tenant_id IN
    (...)`` the planner can combine with the page-order indexes."""
    return Run.objects.filter(tenant_id__in=_visible_tenant_ids(user))


def _visible_tenant_ids(user: User | AnonymousUser) -> list[int]:
    return list(tenants_for(user).values_list("pk", flat=True))


SEARCH_HELP = "run id or its first 8+ characters, external id, worker or lease owner (name or its start), tool"
_HEX_PREFIX = re.compile(r"[0-9a-f]{8,31}")


def _uuid_prefix_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The ids that start with these hex digits: one range of the primary key."""
    return uuid.UUID(prefix.ljust(32, "0")), uuid.UUID(prefix.ljust(32, "f"))


def _search_condition(q: str) -> Q:
    """Runs matching ``q``: a run id, or the start of one (8 hex digits or more: one range
    of the primary key); or any of external id (substring; a trigram index on PostgreSQL),
    worker name (its start, case-insensitive), lease owner id (its start), tool of an
    operation (case-insensitive). Cheap probes first find which kinds ``q`` matches at all;
    only those become conditions, each a per-run check the newest-first page walk can stop
    early on, so a term that matches a quarter of all runs costs as little as a rare one."""
    try:
        return Q(pk=uuid.UUID(q))
    except ValueError:
        pass
    conditions: list[Q] = []
    compact = q.lower().replace("-", "")
    if _HEX_PREFIX.fullmatch(compact):
        low, high = _uuid_prefix_range(compact)
        conditions.append(Q(pk__gte=low, pk__lte=high))
    if Run.objects.filter(external_id__icontains=q).exists():
        conditions.append(Q(external_id__icontains=q))
    worker_ids = list(Worker.objects.filter(name__istartswith=q).values_list("pk", flat=True)[:100])
    if worker_ids:
        conditions.append(Q(Exists(LeaseGrant.objects.filter(run_id=OuterRef("pk"), worker_id__in=worker_ids))))
    if LeaseGrant.objects.filter(owner_id__startswith=q).exists():
        conditions.append(Q(Exists(LeaseGrant.objects.filter(run_id=OuterRef("pk"), owner_id__startswith=q))))
    if Operation.objects.filter(tool__iexact=q).exists():
        conditions.append(Q(Exists(Operation.objects.filter(run_id=OuterRef("pk"), tool__iexact=q))))
    if not conditions:
        return Q(pk__in=[])
    condition = conditions[0]
    for more in conditions[1:]:
        condition |= more
    return condition


def runs_search(
    *,
    user: User | AnonymousUser,
    q: str = "",
    status: str = "",
    indicators: dict[str, str] | None = None,
    tenant: str = "",
    worker: str = "",
    tool: str = "",
    effect_class: str = "",
    phase: str = "",
    stuck: bool = False,
) -> QuerySet[Run]:
    """Runs visible to ``user`` matching the search (run id or its start, external id,
    worker or owner, tool) and the filters: status, the indicators (conditions on the run's
    own columns), tenant (slug), worker (name, any case: it held the run's lease), tool
    (any case) and effect class (of one of its operations), phase (one of its operations is
    in it: the run's own phase counts), stuck (ACTIVE with no lease or no progress past its
    tenant's ``stuck_after_s``: ``ledger.observability.stuck``, over index run_active_recent)."""
    tenant_ids = _visible_tenant_ids(user)
    qs = Run.objects.filter(tenant_id__in=tenant_ids)
    q = q.strip()
    if q:
        qs = qs.filter(_search_condition(q))
    if status:
        qs = qs.filter(status=status)
    for name, value in (indicators or {}).items():
        condition = INDICATOR_FILTERS.get(name, {}).get(value)
        if condition is not None:
            qs = qs.filter(condition())
    if tenant:
        qs = qs.filter(tenant__slug=tenant)
    if worker:
        workers = Worker.objects.filter(name__iexact=worker).values("pk")
        qs = qs.filter(Exists(LeaseGrant.objects.filter(run_id=OuterRef("pk"), worker_id__in=workers)))
    if tool:
        qs = qs.filter(Exists(Operation.objects.filter(run_id=OuterRef("pk"), tool__iexact=tool)))
    if effect_class:
        qs = qs.filter(Exists(Operation.objects.filter(run_id=OuterRef("pk"), effect_class=effect_class)))
    if phase:
        qs = qs.filter(**{f"{phase_count_field(phase)}__gt": 0})
    if stuck:
        qs = qs.filter(stuck_condition(stuck_limits(tenant_ids), now=timezone.now()))
    return qs


def runs_stuck_flags(runs: list[Run], *, now: datetime | None = None) -> dict[uuid.UUID, Stuck]:
    """Which of ``runs`` (with their leases loaded) are stuck, and why: one query for their
    tenants' limits, none per run."""
    now = now or timezone.now()
    active = [run for run in runs if run.status == "ACTIVE"]
    if not active:
        return {}
    limits = stuck_limits(sorted({run.tenant_id for run in active}))
    flags = {run.pk: stuck_reason(run, limit_s=limits[run.tenant_id], now=now) for run in active}
    return {pk: flag for pk, flag in flags.items() if flag is not None}


def runs_page(
    qs: QuerySet[Run], *, before: str = "", back: str = "", size: int = RUN_PAGE, oldest_first: bool = False
) -> Page[Run]:
    """One page of ``qs`` newest first (or oldest first), after the cursor ``before`` (or
    the page ending at the cursor ``back``), with its neighbours' cursors and capped total."""
    qs = qs.select_related("tenant", "lease", "lease__worker")
    return keyset_page(
        qs, order_field="created_at", cursor=before, back=back or None, size=size, descending=not oldest_first
    )


def run_events_page(*, run: Run, after: int = 0, size: int = EVENT_PAGE) -> tuple[list[Event], int | None]:
    """The run's events in seq order after ``after``; and the next cursor (a seq)."""
    rows = list(Event.objects.filter(run=run, seq__gt=after).order_by("seq")[: size + 1])
    next_after = rows[size - 1].seq if len(rows) > size else None
    return rows[:size], next_after


def run_latest_checkpoint(*, run: Run) -> ProgressCheckpoint | None:
    """The run's latest progress checkpoint (a new lease owner resumes from it), or None."""
    return ProgressCheckpoint.objects.filter(run=run).order_by("-seq").first()


def run_operations(*, run: Run) -> QuerySet[Operation]:
    """The run's operations in the run page's order (index ``operation_run``)."""
    return Operation.objects.filter(run=run).order_by("created_at", "id")


def run_detail_parts(*, run: Run, limit: int = 100) -> dict[str, Any]:
    """Lease history, the latest progress checkpoint, stale-write refusals, capability
    budgets, what the run holds and its cost windows: a fixed number of queries. (Its
    operations with their reconciliation cases: ``approvals.selectors.run_operations``.)"""
    return {
        "checkpoint": run_latest_checkpoint(run=run),
        "grants": list(LeaseGrant.objects.filter(run=run).select_related("worker").order_by("-fencing_token")[:limit]),
        "refusals": list(Event.objects.filter(run=run, type="STALE_TOKEN_REJECTED").order_by("-seq")[:limit]),
        "capabilities": list(CapabilityBudget.objects.filter(run=run).order_by("created_at")[:limit]),
        # What the run holds: its registered resources, and its credential leases beside them.
        "resources": list(
            RunResource.objects.filter(run=run).select_related("instance", "alert").order_by("created_at")[:limit]
        ),
        "credential_leases": list(
            CredentialLease.objects.filter(run=run).select_related("credential").order_by("issued_at")[:limit]
        ),
        "cost_windows": list(
            CostWindow.objects.filter(tenant_id=run.tenant_id, kind="RUN", key=str(run.pk)).order_by("-starts_at")[
                :limit
            ]
        ),
    }


# What ``fenceline-mcp`` (the MCP gateway, clients/python) appends to the run of an MCP session.
MCP_SESSION, MCP_REDACTED = "x.mcp.session", "x.mcp.redacted"  # index event_mcp names both


def run_mcp_session(*, run: Run, limit: int = 100) -> dict[str, Any] | None:
    """The MCP session this run is, as the gateway recorded it at the session's start (the
    first ``x.mcp.session`` event), with the tools it called (calls per tool) and the results
    it redacted; None for a run that is no MCP session. One query for other runs, three for a
    session. The fields are the worker's own: shown as text, never trusted as markup."""
    event = Event.objects.filter(run=run, type=MCP_SESSION).order_by("seq").only("seq", "fields").first()
    if event is None:
        return None
    fields = event.fields if isinstance(event.fields, dict) else {}
    tools = Operation.objects.filter(run=run).values("tool").annotate(calls=Count("id")).order_by("tool")
    redacted = Event.objects.filter(run=run, type=MCP_REDACTED).order_by("seq").values_list("seq", "fields")
    return {
        "seq": event.seq,
        **{name: _text(fields.get(name)) for name in ("session_id", "client_name", "client_version")},
        "protocol_version": _text(fields.get("protocol_version")),
        "upstreams": [_text(u) for u in _listed(fields.get("upstreams"))],
        "tools": list(tools[:limit]),
        "redactions": [_redaction(seq, f) for seq, f in redacted[:limit]],
    }


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _listed(value: object) -> list[object]:
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, list) else [value]


def _redaction(seq: int, fields: object) -> dict[str, Any]:
    f = fields if isinstance(fields, dict) else {}
    return {
        "seq": seq,
        "tool": _text(f.get("tool")),
        "operation_id": _text(f.get("operation_id")),
        "kinds": [_text(k) for k in _listed(f.get("kinds"))],
        "count": _text(f.get("count")),
    }


def span_text(span: timedelta | None) -> str:
    """A duration for people: "45 s", "12 min", "3 h 5 min", "2 d 4 h" ("" for none)."""
    if span is None:
        return ""
    seconds = int(span.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours < 1:
        return f"{minutes} min"
    if days < 1:
        return f"{hours} h {minutes % 60} min" if minutes % 60 else f"{hours} h"
    return f"{days} d {hours % 24} h" if hours % 24 else f"{days} d"


def dashboard_counts(*, user: User | AnonymousUser) -> dict[str, Any]:
    """What needs a person now in the ledger, per visible tenant: held leases expiring (counted
    up to DASHBOARD_COUNT_CAP: "capped" names the counts that hit it), stale-token rejections,
    BROKEN runs, the newest verification, breakers not NORMAL. The dashboard adds the people's
    queues to these rows (``approvals.selectors.dashboard_counts``)."""
    now = timezone.now()
    tenants = list(tenants_for(user).order_by("slug"))
    ids = [t.pk for t in tenants]
    rows: dict[int, dict[str, Any]] = {
        t.pk: {
            "tenant": t,
            "expiring_leases": 0,
            "stale_rejections": 0,
            "broken_runs": 0,
            "stuck_runs": 0,
            "last_verified_at": None,
            "capped": set(),  # the counts that stopped at DASHBOARD_COUNT_CAP: "at least"
        }
        for t in tenants
    }
    if ids:
        for tenant_id, n in _expiring_leases(ids, expiring_by=now + timedelta(seconds=EXPIRING_WITHIN_S)).items():
            rows[tenant_id]["expiring_leases"] = min(n, DASHBOARD_COUNT_CAP)
            if n > DASHBOARD_COUNT_CAP:
                rows[tenant_id]["capped"].add("expiring_leases")
        for r in (
            Run.objects.filter(tenant_id__in=ids, stale_rejections__gt=0)  # index run_stale
            .values("tenant_id")
            .annotate(n=Sum("stale_rejections"))
            .order_by()
        ):
            rows[r["tenant_id"]]["stale_rejections"] = r["n"]
        for r in (
            Run.objects.filter(tenant_id__in=ids)
            .filter(~Q(broken_reason=""))  # index run_broken_recent
            .values("tenant_id")
            .annotate(n=Count("id"))
            .order_by()
        ):
            rows[r["tenant_id"]]["broken_runs"] = r["n"]
        for tenant_id, n in stuck_counts(ids, cap=DASHBOARD_COUNT_CAP, now=now).items():
            rows[tenant_id]["stuck_runs"] = min(n, DASHBOARD_COUNT_CAP)
            if n > DASHBOARD_COUNT_CAP:
                rows[tenant_id]["capped"].add("stuck_runs")
        for tenant_id, verified_at in _newest_verifications(ids):
            rows[tenant_id]["last_verified_at"] = verified_at
    per_tenant = list(rows.values())
    verified = [r["last_verified_at"] for r in per_tenant if r["last_verified_at"]]
    return {
        "now": now,
        "tenants": per_tenant,
        "expiring_leases": sum(r["expiring_leases"] for r in per_tenant),
        "stale_rejections": sum(r["stale_rejections"] for r in per_tenant),
        "broken_runs": sum(r["broken_runs"] for r in per_tenant),
        "stuck_runs": sum(r["stuck_runs"] for r in per_tenant),
        "breakers_not_normal": [t for t in tenants if t.breaker_state != "NORMAL"],
        "last_verified_at": max(verified) if verified else None,
        "capped": set().union(*(r["capped"] for r in per_tenant)),  # a total of an "at least" is one too
        "cap": DASHBOARD_COUNT_CAP,
    }


def _newest_verifications(ids: list[int]) -> list[tuple[int, datetime | None]]:
    """The newest verification per tenant: one backward step in index run_verified each,
    rather than a MAX over every run."""
    newest = Run.objects.filter(
        tenant_id=OuterRef("pk"), verified_checkpoint_seq__isnull=False, verified_at__isnull=False
    ).order_by("-verified_at")
    return list(
        Tenant.objects.filter(pk__in=ids).annotate(v=Subquery(newest.values("verified_at")[:1])).values_list("pk", "v")
    )


def _expiring_leases(ids: list[int], *, expiring_by: datetime) -> dict[int, int]:
    """Per tenant: its held leases expiring by ``expiring_by`` (or overdue), counted up to
    ``DASHBOARD_COUNT_CAP + 1`` (one more means "more than the cap"): one statement, each count
    a LIMITed walk of index lease_held_worker rather than every row. A held lease is counted by
    its worker's tenant, which is its run's (a worker acts only in its own tenant): the
    tenant's few workers lead into lease_held_worker, where joining the runs read a million of
    them whenever the planner misjudged how many leases were expiring."""
    expiring = RunLease.objects.filter(
        worker__tenant_id=OuterRef("pk"), owner_id__isnull=False, expires_at__lte=expiring_by
    ).values("pk")[: DASHBOARD_COUNT_CAP + 1]
    counted = Tenant.objects.filter(pk__in=ids).annotate(n=CappedCount(expiring)).values_list("pk", "n")
    return dict(counted)


# --- liveness apart from ownership (article "Your Agent Needs a Run Lease") --------------

LIVENESS_STATES = ("PROCESS_ALIVE", "LEASE_VALID", "LEASE_LOST", "OUTCOME_UNKNOWN", "RECONCILIATION_REQUIRED")


def process_alive(worker: Worker | None, now: datetime) -> bool:
    """The worker's process heartbeat is fresh (FENCELINE_WORKER_HEARTBEAT_LAPSE_S)."""
    if worker is None or worker.last_heartbeat_at is None:
        return False
    lapse_s: int = settings.FENCELINE["WORKER_HEARTBEAT_LAPSE_S"]
    return (now - worker.last_heartbeat_at).total_seconds() <= lapse_s


def run_liveness(*, run: Run, unknown: UnknownTime, now: datetime) -> dict[str, Any]:
    """The run-lease article's separate states for one run: is the holder's process alive,
    is the lease valid or lost, is some outcome UNKNOWN (or in flight under a lost lease),
    does a person need to reconcile; and the time spent in OUTCOME_UNKNOWN. ``unknown`` is
    that time, read from the run's cases by the approvals app
    (``approvals.selectors.run_unknown_time``)."""
    lease = run.lease
    expires_at = lease.expires_at
    owned = lease.owner_id is not None and expires_at is not None
    valid = owned and expires_at is not None and expires_at > now
    lost = (owned and not valid) or (not owned and lease.end_reason in ("EXPIRED", "REVOKED"))
    holds = {
        "PROCESS_ALIVE": process_alive(lease.worker if owned else None, now),
        "LEASE_VALID": valid,
        "LEASE_LOST": lost,
        "OUTCOME_UNKNOWN": run.n_unknown > 0 or (lost and run.n_dispatched > 0),
        "RECONCILIATION_REQUIRED": unknown["open_cases"] > 0,
    }
    return {"states": [name for name in LIVENESS_STATES if holds[name]], **unknown}


def worker_liveness(*, worker: Worker, unknown: UnknownTime, now: datetime) -> dict[str, Any]:
    """The same states for a worker: its process heartbeat, the leases it holds and has lost,
    and the UNKNOWN outcomes of effects it dispatched (``unknown``: their cases, time spent in
    UNKNOWN; ``approvals.selectors.worker_unknown_time``)."""
    held = RunLease.objects.filter(worker=worker, owner_id__isnull=False)
    valid = held.filter(expires_at__gt=now).count()
    lost = (
        held.filter(expires_at__lte=now).count()
        + LeaseGrant.objects.filter(worker=worker, end_reason__in=["EXPIRED", "REVOKED"]).count()
    )
    holds = {
        "PROCESS_ALIVE": process_alive(worker, now),
        "LEASE_VALID": valid > 0,
        "LEASE_LOST": lost > 0,
        # An effect whose outcome nobody can report: a case is open, or a lost lease still
        # has effects in flight (the reaper has not turned them UNKNOWN yet).
        "OUTCOME_UNKNOWN": unknown["open_cases"] > 0
        or held.filter(expires_at__lte=now, run__n_dispatched__gt=0).exists(),
        "RECONCILIATION_REQUIRED": unknown["open_cases"] > 0,
    }
    return {
        "states": [name for name in LIVENESS_STATES if holds[name]],
        "leases_valid": valid,
        "leases_lost": lost,
        **unknown,
    }


def diagnostic_payload(*, user: User | AnonymousUser, run: Run, seq: int) -> dict[str, Any]:
    """The diagnostic payload the event at ``seq`` of ``run`` commits to, as sent (user
    content decrypted), for a user who may see the run's tenant's diagnostic plane
    (``ledger.roles.DIAGNOSTICS``): {"seq", "class", "digest", "created_at", "payload"},
    ``payload`` None once retention removed it (``removed_at`` then says when). NotFound
    when the event commits to none; PermissionDenied for a role that may not see it."""
    if not can(user, run.tenant, DIAGNOSTICS):
        raise PermissionDenied("your role on this tenant does not allow reading diagnostic payloads")
    kept = DiagnosticPayload.objects.filter(run=run, seq=seq).first()
    if kept is None:
        raise NotFound("this event has no diagnostic payload")
    return {
        "seq": kept.seq,
        "class": kept.klass,
        "digest": kept.digest,
        "created_at": kept.created_at,
        "removed_at": kept.removed_at,
        "payload": None if kept.body is None else opened(run.pk, kept.klass, kept.body),
    }


# --- an admin's run-level fixes (issue 40): what each will do, before it is confirmed -----

PREVIEW_LIMIT = 100


def force_release_preview(*, run: Run, limit: int = PREVIEW_LIMIT) -> dict[str, Any]:
    """What a force-release of ``run``'s lease (``lease_force_release``) would do now: whose
    lease and which token it ends, the DISPATCHED operations that become UNKNOWN with a case
    each (the first ``limit``; ``dispatched`` counts them all), and what the run holds that
    goes to the reaper. Read, not locked: the confirmation names the token, and a lease that
    changed hands since is refused."""
    lease, now = run.lease, timezone.now()
    dispatched = run.n_dispatched
    operations = (
        list(Operation.objects.filter(run=run, phase="DISPATCHED").order_by("created_at", "id")[:limit])
        if dispatched
        else []
    )
    return {
        "held": lease.owner_id is not None,
        "expired": lease.owner_id is not None and lease.expires_at is not None and lease.expires_at <= now,
        "lease": lease,
        "operations": operations,
        "dispatched": dispatched,
        "resources_open": RunResource.objects.filter(run=run).exclude(state="RELEASED").count()
        if run.n_resources
        else 0,
        "limit": limit,
    }


def operation_retry_preview(*, run: Run, operation_id: object) -> dict[str, Any]:
    """What an admin's retry of one of ``run``'s operations (``operation_retry_by_admin``)
    would do now: the retry decision (the worker's own, by phase, class and attempts) and
    what follows from it — refused (RECONCILE, STOP, a delivery recorded), an approval asked
    (APPROVAL: or used, when one is approved for this attempt and token), or attempt + 1
    PLANNED under the same idempotency key. NotFound for another run's operation."""
    op = Operation.objects.filter(run=run, pk=parse_id(operation_id, "operation")).first()
    if op is None:
        raise NotFound("operation not found")
    decision, reason = operation_retry_decision(op)
    refused = None
    if decision in ("RECONCILE", "STOP"):
        refused = reason
    else:
        delivered = delivery_refuses_retry(op)
        refused = delivered.detail if delivered is not None else None
    return {
        "operation": op,
        "decision": decision,
        "reason": reason,
        "refused": refused,
        "needs_approval": decision == "APPROVAL" and refused is None,
        "next_attempt": op.attempt + 1,
        "fencing_token": run.lease.fencing_token,
        "run_active": run.status == "ACTIVE",
    }
