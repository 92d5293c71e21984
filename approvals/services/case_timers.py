"""The reconciliation queue's timers (the tenant policy's ``case_timers``): a claim nobody
acted on within ``ack_s`` expires (CLAIMED -> OPEN, CASE_CLAIM_EXPIRED), and a case left
unclaimed longer than ``escalate_s`` since its effect became UNKNOWN is handed up
(OPEN -> ESCALATED, CASE_ESCALATED by ``system:case-timers``). An escalation is then a
``case_escalated`` webhook notification (``approvals/services/notifications.py``) and, once
committed, goes to the personal route of each of the tenant's admins who asks for my cases.

The job is idempotent and safe beside people: every move is a conditional UPDATE on the
case's status (and, for a claim, on who holds it since when) made with the case's run
locked, the lock every person's action on a case takes too, so a person claiming a case
while the job escalates it gets exactly one outcome: whoever locked the run first wins, the
other finds the case moved and changes nothing."""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from approvals.models import CaseStatus, ReconciliationCase
from approvals.services.notifications import my_case_notify, tenant_admins
from ledger.actors import SYSTEM_CASE_TIMERS
from ledger.errors import WrongPhase
from ledger.models import Run, Tenant
from ledger.policy import case_timers_of
from ledger.roles import ADMINISTER
from ledger.services.authority.policy import policy_now
from ledger.services.core.fencing import runs_locked_for_sweep
from ledger.services.evidence.append import ChainBatch


@dataclass
class TimerPass:
    claims_expired: int = 0
    escalated: int = 0


def _minutes(seconds: int) -> str:
    return f"{seconds // 3600} h" if seconds % 3600 == 0 else f"{seconds // 60} min"


def cases_enforce_timers(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    progress: Callable[[TimerPass], None] | None = None,
) -> TimerPass:
    """Job: for every tenant, its claims older than ``ack_s`` expire, then its OPEN cases
    older than ``escalate_s`` escalate, in batches of at most ``batch_size`` (runs busy
    elsewhere are left for the next pass). Running it twice writes nothing twice."""
    batch_size = batch_size or settings.FENCELINE["CASE_TIMERS_BATCH_SIZE"]
    result = TimerPass()
    for tenant in Tenant.objects.order_by("pk"):
        timers = case_timers_of(policy_now(tenant=tenant).document)
        result.claims_expired += _sweep(tenant, _expire_claims, timers, now=now, batch_size=batch_size)
        result.escalated += _sweep(tenant, _escalate_unclaimed, timers, now=now, batch_size=batch_size)
        if progress is not None:
            progress(result)
    return result


# One batch of one timer for one tenant: (tenant id, its timers, now, the batch, limit) ->
# (cases moved, due cases read under their runs' locks).
type Move = Callable[[int, dict[str, int], datetime, ChainBatch, int], tuple[int, int]]


def _sweep(tenant: Tenant, move: Move, timers: dict[str, int], *, now: datetime | None, batch_size: int) -> int:
    """``move`` in batches, each its own transaction, until a batch finds fewer than a full
    batch of due cases, or moves none (every run it needs is busy elsewhere: the next pass
    takes them)."""
    moved = 0
    while True:
        with transaction.atomic():
            at = now or timezone.now()
            batch = ChainBatch(at)
            won, seen = move(tenant.pk, timers, at, batch, batch_size)
            batch.commit()
        moved += won
        if seen < batch_size or not won:
            return moved


def _locked(due: QuerySet[ReconciliationCase], order: str, limit: int) -> tuple[dict[uuid.UUID, Run], list[Any]]:
    """The runs of the first ``limit`` due cases, locked (skipping busy ones), and the due
    cases of those runs read again under the locks (a case changes only under its run's lock)."""
    run_ids = set(due.order_by(order, "pk").values_list("run_id", flat=True)[:limit])
    runs = {run.pk: run for run in runs_locked_for_sweep(run_ids=run_ids)} if run_ids else {}
    if not runs:
        return {}, []
    rows = list(
        due.filter(run_id__in=list(runs))
        .order_by(order, "pk")
        .values_list("pk", "run_id", "operation_id", "attempt", "claimed_by", "claimed_at")[:limit]
    )
    return runs, rows


def _expire_claims(
    tenant_id: int, timers: dict[str, int], now: datetime, batch: ChainBatch, limit: int
) -> tuple[int, int]:
    """CLAIMED longer than ``ack_s`` -> OPEN (nobody holds it), one CASE_CLAIM_EXPIRED each."""
    ack_s = timers["ack_s"]
    due = ReconciliationCase.objects.filter(
        tenant_id=tenant_id, status=CaseStatus.CLAIMED, claimed_at__lte=now - timedelta(seconds=ack_s)
    )
    runs, rows = _locked(due, "claimed_at", limit)
    won = 0
    entries: list[tuple[Run, dict[str, Any]]] = []
    for pk, run_id, operation_id, attempt, claimed_by, claimed_at in rows:
        # Conditional on the claim being the one found: a reassignment since is a new claim.
        if (
            ReconciliationCase.objects.filter(
                pk=pk, status=CaseStatus.CLAIMED, claimed_by=claimed_by, claimed_at=claimed_at
            ).update(status=CaseStatus.OPEN, claimed_by="", claimed_at=None)
            != 1
        ):
            continue
        won += 1
        entries.append(
            (
                runs[run_id],
                {
                    "case_id": pk,
                    "operation_id": operation_id,
                    "attempt": attempt,
                    "claimed_by": claimed_by,
                    "claimed_at": claimed_at,
                    "reason": f"claimed for longer than {_minutes(ack_s)} without a decision",
                },
            )
        )
    if entries:
        batch.append_many(entries, "CASE_CLAIM_EXPIRED", actor=SYSTEM_CASE_TIMERS)
    return won, len(rows)


def _escalate_unclaimed(
    tenant_id: int, timers: dict[str, int], now: datetime, batch: ChainBatch, limit: int
) -> tuple[int, int]:
    """OPEN (nobody holds it) for longer than ``escalate_s`` since it opened -> ESCALATED,
    one CASE_ESCALATED each, by ``system:case-timers`` with the reason."""
    escalate_s = timers["escalate_s"]
    due = ReconciliationCase.objects.filter(
        tenant_id=tenant_id, status=CaseStatus.OPEN, opened_at__lte=now - timedelta(seconds=escalate_s)
    )
    runs, rows = _locked(due, "opened_at", limit)
    reason = f"unclaimed for longer than {_minutes(escalate_s)}"
    if not rows:
        return 0, 0
    # Read under the runs' locks, so each is still OPEN: one conditional UPDATE moves them.
    won = ReconciliationCase.objects.filter(pk__in=[row[0] for row in rows], status=CaseStatus.OPEN).update(
        status=CaseStatus.ESCALATED, escalated_by=SYSTEM_CASE_TIMERS, escalation_reason=reason, escalated_at=now
    )
    if won != len(rows):  # impossible: a case changes only under its run's lock
        raise WrongPhase(phase="case changed concurrently", wanted=CaseStatus.OPEN)
    batch.append_many(
        [
            (runs[run_id], {"case_id": pk, "operation_id": op_id, "attempt": attempt, "reason": reason})
            for pk, run_id, op_id, attempt, _, _ in rows
        ],
        "CASE_ESCALATED",
        actor=SYSTEM_CASE_TIMERS,
    )
    escalated = [row[0] for row in rows]
    transaction.on_commit(lambda: _route_to_admins(tenant_id, escalated, reason, now))
    return won, len(rows)


def _route_to_admins(tenant_id: int, case_ids: list[uuid.UUID], reason: str, now: datetime) -> None:
    """The timer's escalations go up to the tenant's admins as a person's do: each admin whose
    own route asks for my cases gets one delivery per case."""
    admins = tenant_admins(tenant_id)
    if not admins:
        return
    for case in ReconciliationCase.objects.filter(pk__in=case_ids).select_related("operation"):
        my_case_notify(
            case=case,
            usernames=admins,
            perm=ADMINISTER,
            what="escalated",
            headline=f"Case {str(case.pk)[:8]} ({case.operation.tool}.{case.operation.action}, {case.reason}) "
            f"was escalated by the case timers: {reason}",
            now=now,
        )
