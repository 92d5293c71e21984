"""The deterministic retry gate of the Side-Effect Class article.

The decision is explainable without asking the model: it depends only on the operation's
phase, its side-effect class and its attempt count.
"""

from ledger.models import Operation
from ledger.states import EffectClass, Phase

MAX_AUTOMATIC_ATTEMPTS = 3


def operation_retry_decision(op: Operation) -> tuple[str, str]:
    """Returns ``(decision, reason)`` with decision one of STOP, RETRY, RETRY_SAME_KEY,
    RECONCILE, APPROVAL."""
    phase = Phase(op.phase)
    if phase == Phase.CONFIRMED:
        return "STOP", "the provider confirmed the effect"
    if phase in (Phase.UNKNOWN, Phase.DISPATCHED):
        return "RECONCILE", f"the operation is {phase}: the effect may have happened"
    if phase == Phase.DENIED:
        return "STOP", "the operation was denied"
    if phase in (Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED):
        return "STOP", f"nothing to retry: attempt {op.attempt} has not been dispatched"
    if phase == Phase.RECONCILED and op.reconciliation != "DID_NOT_HAPPEN":
        return "STOP", f"reconciled: the effect {op.reconciliation.lower().replace('_', ' ') or 'was resolved'}"
    # FAILED, or RECONCILED: decide by side-effect class and attempts spent.
    effect = EffectClass(op.effect_class)
    if effect == EffectClass.PURE and op.attempt < MAX_AUTOMATIC_ATTEMPTS:
        return "RETRY", f"PURE operation, attempt {op.attempt} of {MAX_AUTOMATIC_ATTEMPTS}"
    if effect == EffectClass.IDEMPOTENT and op.attempt < MAX_AUTOMATIC_ATTEMPTS:
        return "RETRY_SAME_KEY", f"IDEMPOTENT operation, attempt {op.attempt} of {MAX_AUTOMATIC_ATTEMPTS}"
    if effect == EffectClass.REPLAYABLE:
        return "RECONCILE", "REPLAYABLE operation: check the durable record before repeating"
    if effect in (EffectClass.PURE, EffectClass.IDEMPOTENT):
        return "APPROVAL", f"{MAX_AUTOMATIC_ATTEMPTS} attempts spent"
    return "APPROVAL", f"{effect} operation: repeating needs a human decision"
