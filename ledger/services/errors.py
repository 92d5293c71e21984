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


class Forbidden(DomainError):
    """A person's role on the object's tenant does not allow this action (the console
    checks first; the service checks again)."""

    code = "FORBIDDEN"


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


class ForbiddenField(DomainError):
    """A forbidden key or a credential-like value crossed the secret boundary
    (``ledger/boundary.py``). Names the path and the rule, never the value."""

    code = "FORBIDDEN_FIELD"

    def __init__(self, detail: str, *, path: str, rule: str) -> None:
        super().__init__(detail, path=path, rule=rule)
        self.path = path
        self.rule = rule


class RunCompleted(DomainError):
    code = "RUN_COMPLETED"


class Denied(DomainError):
    """An authority check refused: the code is DENY_REVOKED, DENY_EXPIRED,
    DENY_STALE_VERSION, DENY_ACTION, DENY_RESOURCE, DENY_NO_CAPABILITY, DENY_BUDGET or
    DENY_POLICY. A budget refusal names the budget in ``budget``."""

    def __init__(self, code: str, detail: str, **extra: object) -> None:
        super().__init__(detail, decision=code, **extra)
        self.code = code


class ApprovalRequired(DomainError):
    """Not an error for the caller: the decision waits for a person (HTTP 202)."""

    code = "APPROVAL_REQUIRED"

    def __init__(self, approval_id: object) -> None:
        super().__init__("a person must approve this first", decision="APPROVAL_REQUIRED", approval_id=str(approval_id))
        self.approval_id = approval_id


class ReconcileFirst(DomainError):
    code = "RECONCILE_FIRST"


__all__ = [
    "ApprovalRequired",
    "Denied",
    "DomainError",
    "Forbidden",
    "ForbiddenField",
    "IdempotencyMismatch",
    "InvalidInput",
    "LeaseHeld",
    "LeaseLost",
    "NotFound",
    "ReconcileFirst",
    "RunCompleted",
    "StaleToken",
    "UnknownSchemaVersion",
    "WorkerNotAccepting",
    "WrongPhase",
]
