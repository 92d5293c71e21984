"""One operation's phase change: the step every domain that moves an operation takes (its
worker's calls, a person's reconciliation, an approver's "no").

The change is a conditional UPDATE on the phase the caller read, along an edge of
``ledger.states.PHASE_TRANSITIONS``, made with the run locked (``ledger.services.core.
fencing``), and appends exactly one OPERATION_<phase> event to the run's chain in the same
transaction (invariants 4 and 5).
"""

from typing import Any

from ledger.errors import WrongPhase
from ledger.models import Operation
from ledger.services.core.fencing import Fenced
from ledger.states import Phase, can_move

# Changed columns worth naming in the transition's event (when they carry a value), by the
# name the event gives each: the fencing token an operation was dispatched under is the
# event's ``dispatch_token`` (the evidence format's word, kept by every chain).
LOGGED_CHANGES = {
    "fencing_token": "dispatch_token",
    "provider_request_id": "provider_request_id",
    "provider_ref": "provider_ref",
    "actual_cost_cents": "actual_cost_cents",
    "error_code": "error_code",
    "fallback_used": "fallback_used",
}


def transition(
    op: Operation,
    target: Phase,
    ctx: Fenced,
    *,
    reason: str | None = None,
    event_fields: dict[str, Any] | None = None,
    **changes: Any,
) -> None:
    """Move ``op`` to ``target`` if it is still in the phase we read, and log the event."""
    source = Phase(op.phase)
    if not can_move(source, target):
        raise WrongPhase(phase=source, wanted=" or ".join(sorted(p for p in Phase if can_move(p, target))))
    # Impossible to miss while the run is locked; refuse rather than guess. The fence's batch
    # sends the UPDATE with the chain (``ChainBatch.update``).
    ctx.batch.update(
        Operation,
        {"phase": target, "updated_at": ctx.now, **changes},
        where={"id": op.pk, "phase": source},
        refusal=lambda: WrongPhase(phase="changed concurrently", wanted=source),
    )
    ctx.batch.count_move(ctx.run, source, target)
    op.phase = target
    for name, value in changes.items():
        setattr(op, name, value)
    fields: dict[str, Any] = {"operation_id": op.pk, "from": source.value, "to": target.value, "attempt": op.attempt}
    if reason:
        fields["reason"] = reason
    fields.update({LOGGED_CHANGES[k]: v for k, v in changes.items() if k in LOGGED_CHANGES and v not in (None, "")})
    fields.update({k: v for k, v in (event_fields or {}).items() if v is not None})
    ctx.batch.append(ctx.run, f"OPERATION_{target.value}", actor=ctx.actor, fields=fields)
