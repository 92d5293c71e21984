"""The retry gate of the Side-Effect Class article, row by row."""

import pytest

from ledger.models import Operation
from ledger.services.fence.retry import operation_retry_decision


@pytest.mark.parametrize(
    "phase, effect, attempt, decision",
    [
        ("CONFIRMED", "PURE", 1, "STOP"),
        ("CONFIRMED", "NON_RETRYABLE", 1, "STOP"),
        ("UNKNOWN", "PURE", 1, "RECONCILE"),
        ("UNKNOWN", "IDEMPOTENT", 1, "RECONCILE"),
        ("DISPATCHED", "IDEMPOTENT", 1, "RECONCILE"),
        ("FAILED", "PURE", 1, "RETRY"),
        ("FAILED", "PURE", 2, "RETRY"),
        ("FAILED", "PURE", 3, "APPROVAL"),
        ("FAILED", "IDEMPOTENT", 1, "RETRY_SAME_KEY"),
        ("FAILED", "IDEMPOTENT", 3, "APPROVAL"),
        ("FAILED", "REPLAYABLE", 1, "RECONCILE"),
        ("FAILED", "UNKNOWN", 1, "APPROVAL"),
        ("FAILED", "NON_RETRYABLE", 1, "APPROVAL"),
        ("DENIED", "PURE", 1, "STOP"),
        ("PLANNED", "PURE", 1, "STOP"),
    ],
)
def test_retry_decision_table(phase, effect, attempt, decision):
    op = Operation(phase=phase, effect_class=effect, attempt=attempt)
    got, reason = operation_retry_decision(op)
    assert got == decision
    assert reason
