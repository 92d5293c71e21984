"""The one family of domain errors raised by services.

Each error carries the documented code; the worker API maps classes to HTTP statuses in
one place (``ledger/api/errors.py``). ``detail`` is written for a person and never echoes
a value a caller sent.
"""

from ledger.versioning import UnknownSchemaVersion


class DomainError(Exception):
    code = "ERROR"

    def __init__(self, detail: str, **extra: object) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class NotFound(DomainError):
    code = "NOT_FOUND"


class InvalidInput(DomainError):
    code = "VALIDATION_ERROR"


class LeaseHeld(DomainError):
    code = "LEASE_HELD"


class LeaseLost(DomainError):
    """A renew or release by a caller who no longer owns the lease."""

    code = "LEASE_LOST"

    def __init__(self, reason: str) -> None:
        super().__init__(f"the lease is no longer yours: {reason.replace('_', ' ')}", reason=reason)
        self.reason = reason


class StaleToken(DomainError):
    """A write carrying a fencing token that is not the run's current, unexpired one."""

    code = "STALE_TOKEN"

    def __init__(self, reason: str) -> None:
        super().__init__(f"fencing token refused: {reason.replace('_', ' ')}", reason=reason)
        self.reason = reason


class WrongPhase(DomainError):
    code = "WRONG_PHASE"

    def __init__(self, *, phase: str, wanted: str) -> None:
        super().__init__(f"operation is {phase}; this call needs {wanted}", phase=phase)


class IdempotencyMismatch(DomainError):
    code = "IDEMPOTENCY_MISMATCH"


class WorkerNotAccepting(DomainError):
    code = "WORKER_NOT_ACCEPTING"


__all__ = [
    "DomainError",
    "IdempotencyMismatch",
    "InvalidInput",
    "LeaseHeld",
    "LeaseLost",
    "NotFound",
    "StaleToken",
    "UnknownSchemaVersion",
    "WorkerNotAccepting",
    "WrongPhase",
]
