"""The run page's time axis (issue 40): a selector that lays out, on one clock from the run's
creation to its end (or now), its leases with their takeovers and the gaps with no lease, its
operations from intent to outcome with their UNKNOWN spans (from their reconciliation cases),
and its approval requests. Here, not in ledger, because cases and approvals are this app's.

Bounded whatever the run's size: it reads what the run page has loaded already (the first
``OPERATION_ROWS`` operations with their cases, the newest lease grants) and one query of at
most ``APPROVAL_ROWS`` approvals; never the events, so a run of 10,000 events costs what a
run of ten does. What is left out is counted and said ("and 212 more operations").

The template draws it as SVG (presentation attributes only: the CSP allows no inline style)
with a pattern and a word for each kind, so it reads without colour, and gives the same
spans as a list for screen readers and for copying.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from approvals.models import ApprovalRequest
from ledger.models import LeaseGrant, Operation, Run
from ledger.states import Phase

OPERATION_ROWS = 40  # one row each; the rest are counted
APPROVAL_ROWS = 50
TICKS = 4  # moments written under the axis, besides its two ends
MIN_LABEL_PCT = 9.0  # a bar narrower than this carries its words in its title only


@dataclass
class Span:
    """One bar: what (``kind``: held, no-lease, intent, dispatched, unknown, reconciled,
    approval), where on the axis (percent of its width), its words and its full title."""

    kind: str
    start: datetime
    end: datetime | None  # None: still open (drawn to the axis' end)
    label: str
    title: str
    x: float = 0.0
    width: float = 0.0
    mark: str = ""  # a point at the bar's start: "takeover"

    @property
    def text_x(self) -> float:
        """Where its words start: just inside its left end."""
        return round(self.x + 0.5, 2)

    @property
    def labelled(self) -> bool:
        return self.width >= MIN_LABEL_PCT


@dataclass
class Lane:
    name: str
    spans: list[Span] = field(default_factory=list)
    note: str = ""

    @property
    def summary(self) -> str:
        """The lane in words, for its ``aria-label``."""
        return f"{self.name}: " + "; ".join(s.title for s in self.spans) if self.spans else f"{self.name}: nothing"


def _at(moment: datetime | None) -> str:
    return moment.strftime("%H:%M:%S") if moment else "now"


def _lease_lane(run: Run, grants: list[LeaseGrant], *, end: datetime) -> Lane:
    """The grants oldest first, each held from its acquisition to its end (the current one to
    its expiry or the axis' end), and a no-lease span wherever none was held."""
    lane = Lane("Leases")
    cursor = run.created_at
    for g in sorted(grants, key=lambda g: g.fencing_token):
        if g.acquired_at > cursor + timedelta(seconds=1):
            lane.spans.append(_no_lease(cursor, g.acquired_at))
        stop = g.ended_at
        if stop is None and run.lease.fencing_token == g.fencing_token and run.lease.expires_at is not None:
            stop = min(run.lease.expires_at, end) if run.lease.expires_at < end else None
        how = (g.end_reason or "held").lower()
        took = f", took over from {g.previous_owner_id}" if g.previous_owner_id else ""
        lane.spans.append(
            Span(
                kind="held",
                start=g.acquired_at,
                end=stop,
                label=f"token {g.fencing_token}",
                title=f"token {g.fencing_token} held by {g.owner_id} from {_at(g.acquired_at)} to {_at(stop)} ({how}){took}",
                mark="takeover" if g.previous_owner_id else "",
            )
        )
        cursor = stop or end
    held_now = run.lease.owner_id is not None and run.lease.expires_at is not None and run.lease.expires_at > end
    # Since the last end (or the creation) nobody holds it; not the instant a run's end took it.
    if not held_now and cursor <= end and (run.completed_at is None or cursor < end - timedelta(seconds=1)):
        lane.spans.append(_no_lease(cursor, end if run.completed_at else None))
    return lane


def _no_lease(start: datetime, stop: datetime | None) -> Span:
    return Span(
        kind="no-lease",
        start=start,
        end=stop,
        label="no lease",
        title=f"no lease from {_at(start)} to {_at(stop)}: nobody could act for the run",
    )


def _operation_lane(op: Operation) -> Lane:
    """Intent to dispatch, dispatch to outcome, and the UNKNOWN span of each attempt's case."""
    lane = Lane(f"{op.tool} · {op.action}" + (f" (attempt {op.attempt})" if op.attempt > 1 else ""))
    phase = Phase(op.phase)
    waiting_end = op.dispatched_at or (op.updated_at if phase not in _OPEN else None)
    lane.spans.append(
        Span(
            kind="intent",
            start=op.created_at,
            end=waiting_end,
            label="intent",
            title=f"intent at {_at(op.created_at)}, {'dispatched' if op.dispatched_at else phase.lower()} at {_at(waiting_end)}",
        )
    )
    cases = sorted(op.cases.all(), key=lambda c: c.opened_at)
    if op.dispatched_at is not None:
        outcome_at = cases[0].opened_at if cases else (op.updated_at if phase != Phase.DISPATCHED else None)
        told = "no outcome yet" if outcome_at is None else ("UNKNOWN" if cases else phase.value)
        lane.spans.append(
            Span(
                kind="dispatched",
                start=op.dispatched_at,
                end=outcome_at,
                label="dispatched",
                title=f"dispatched at {_at(op.dispatched_at)} under token {op.fencing_token}; {told} at {_at(outcome_at)}",
            )
        )
    for case in cases:
        settled = case.resolved_at
        lane.spans.append(
            Span(
                kind="unknown" if settled is None else "reconciled",
                start=case.opened_at,
                end=settled,
                label="UNKNOWN",
                title=(
                    f"UNKNOWN from {_at(case.opened_at)} ({case.reason})"
                    + (
                        f", reconciled {case.resolution} at {_at(settled)} by {case.resolved_by}"
                        if settled
                        else ", not reconciled yet"
                    )
                ),
            )
        )
    lane.note = phase.value + (f": {op.reconciliation}" if op.reconciliation else "")
    return lane


_OPEN = frozenset({Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED, Phase.DISPATCHED})


def _approval_lane(approvals: list[ApprovalRequest]) -> Lane:
    lane = Lane("Approvals")
    for a in approvals:
        stop = a.used_at or a.decided_at or (a.expires_at if a.status in ("EXPIRED",) else None)
        lane.spans.append(
            Span(
                kind="approval",
                start=a.requested_at,
                end=stop,
                label=a.kind.lower(),
                title=f"{a.kind} approval asked at {_at(a.requested_at)} under token {a.fencing_token}: {a.status}"
                + (f" at {_at(stop)}" if stop else "")
                + (f" by {a.decided_by}" if a.decided_by else ""),
            )
        )
    return lane


def _place(spans: list[Span], *, start: datetime, end: datetime) -> None:
    total = max((end - start).total_seconds(), 1.0)
    for s in spans:
        left = min(max((s.start - start).total_seconds() / total * 100, 0.0), 100.0)
        right = min(max(((s.end or end) - start).total_seconds() / total * 100, left), 100.0)
        s.x, s.width = round(left, 2), round(max(right - left, 0.4), 2)


def run_time_axis(
    *, run: Run, operations: list[Operation], grants: list[LeaseGrant], now: datetime | None = None
) -> dict[str, Any]:
    """The axis of ``run`` from what the run page loaded (its operations with their cases,
    its newest grants) and its first APPROVAL_ROWS approvals: {start, end, lanes, ticks,
    operations_left_out}. One query."""
    now = now or timezone.now()
    start, end = run.created_at, run.completed_at or now
    approvals = list(ApprovalRequest.objects.filter(run=run).order_by("requested_at", "pk")[:APPROVAL_ROWS])
    lanes = [_lease_lane(run, grants, end=end)]
    if approvals:
        lanes.append(_approval_lane(approvals))
    shown = operations[:OPERATION_ROWS]
    lanes += [_operation_lane(op) for op in shown]
    for lane in lanes:
        _place(lane.spans, start=start, end=end)
    total_ops = sum(
        getattr(run, f"n_{p}")
        for p in (
            "planned",
            "pending_approval",
            "authorized",
            "denied",
            "dispatched",
            "confirmed",
            "failed",
            "unknown",
            "reconciled",
        )
    )
    span_s = max((end - start).total_seconds(), 1.0)
    ticks = [
        {"x": round(i * 100 / (TICKS + 1), 2), "text": _at(start + timedelta(seconds=span_s * i / (TICKS + 1)))}
        for i in range(1, TICKS + 1)
    ]
    return {
        "start": start,
        "end": end,
        "open": run.completed_at is None,
        "lanes": lanes,
        "ticks": ticks,
        "operations_left_out": max(total_ops - len(shown), 0),
        "operations_drawn": len(shown),
        "takeovers": sum(1 for g in grants if g.previous_owner_id),
    }
