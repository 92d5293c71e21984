"""DISPATCHED -> UNKNOWN: the step every path takes when nobody can report an effect's
outcome any more (the worker said UNKNOWN, the lease was lost, released or revoked), with a
reconciliation case for each operation and its cost reservation kept counted as UNKNOWN
(invariant 4: no default ever turns UNKNOWN into success)."""

import uuid
from collections.abc import Sequence
from typing import Any

from ledger.errors import WrongPhase
from ledger.models import Operation, Run
from ledger.services.authority.reservations import cost_mark_unknown
from ledger.services.core.handoff import queues
from ledger.services.core.phases import LOGGED_CHANGES
from ledger.services.evidence.append import ChainBatch
from ledger.states import CaseReason, Phase


def operations_mark_unknown(
    *,
    operations: list[Operation],
    runs: dict[uuid.UUID, Run],
    batch: ChainBatch,
    actor: str,
    reason: CaseReason,
    changes: dict[str, Any] | None = None,
) -> dict[uuid.UUID, Any]:
    """DISPATCHED -> UNKNOWN for a set of operations whose runs the caller has locked, in
    one UPDATE, with one reconciliation case and one event each. ``runs`` maps run id to
    the locked run; ``changes``, the operation's other columns to set. Returns {op_id:
    case} (the case is the approvals app's row: ``ledger.services.core.handoff``)."""
    if not operations:
        return {}
    changes = changes or {}
    ids = [op.pk for op in operations]
    moved = Operation.objects.filter(pk__in=ids, phase=Phase.DISPATCHED).update(
        phase=Phase.UNKNOWN, updated_at=batch.now, **changes
    )
    if moved != len(ids):  # impossible while the runs are locked
        raise WrongPhase(phase="changed concurrently", wanted=Phase.DISPATCHED)
    cases = queues().cases_open(operations=operations, reason=reason, now=batch.now)
    for op in operations:
        op.phase = Phase.UNKNOWN
        for name, value in changes.items():
            setattr(op, name, value)
        fields = {
            "operation_id": op.pk,
            "from": Phase.DISPATCHED.value,
            "to": Phase.UNKNOWN.value,
            "attempt": op.attempt,
            "reason": reason.value,
            "case_id": cases[op.pk].pk,
        }
        fields.update({k: v for k, v in changes.items() if k in LOGGED_CHANGES and v not in (None, "")})
        batch.count_move(runs[op.run_id], Phase.DISPATCHED, Phase.UNKNOWN)
        batch.append(runs[op.run_id], "OPERATION_UNKNOWN", actor=actor, fields=fields)
    # Their cost reservations stay counted, as UNKNOWN, until reconciliation settles them.
    cost_mark_unknown(ops=operations, runs=runs, batch=batch, actor=actor, now=batch.now, reason=reason)
    return cases


def operations_orphaned(*, runs: Sequence[Run]) -> list[Operation]:
    """The DISPATCHED operations of runs whose lease was lost (runs locked by the caller,
    whose phase counts say how many each has: none, no statement)."""
    run_ids = [run.pk for run in runs if run.n_dispatched]
    if not run_ids:
        return []
    return list(Operation.objects.filter(run_id__in=run_ids, phase=Phase.DISPATCHED).order_by("created_at"))
