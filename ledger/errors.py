"""The one family of domain errors: every refusal Fenceline makes is one of these.

Each error knows its documented ``code`` and its HTTP ``status``; the worker API, the
console and the management commands all answer with them (``ledger/api/errors.py`` turns
one into ``{"error": code, "detail": ...}``, the console into a page with that status, a
command into a one-line reason and a non-zero exit). ``detail`` is written for a person
and never echoes a value a caller sent.

Standard library only, so the secret boundary and the schema versions can raise them
without importing Django.
"""

import uuid


class DomainError(Exception):
    code = "ERROR"
    status = 400
    # Seconds after which the call may be sent again (the answer's Retry-After header), or None.
    retry_after_s: int | None = None

    def __init__(self, detail: str, *, field: str | None = None, **extra: object) -> None:
        super().__init__(detail)
        self.detail = detail
        if field is not None:  # the field at fault, as validation errors name theirs
            extra["fields"] = [{"field": field, "problem": detail}]
        self.extra = extra

    def body(self) -> dict[str, object]:
        """The refusal as the API writes it: code, detail and the error's own fields."""
        extra = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in self.extra.items()}
        return {"error": self.code, "detail": self.detail, **extra}


class NotFound(DomainError):
    code = "NOT_FOUND"
    status = 404


class InvalidInput(DomainError):
    code = "VALIDATION_ERROR"
    status = 422


class MalformedJSON(DomainError):
    """The body is not one unambiguous JSON object: not JSON, not an object, a NaN or
    Infinity, or a key that appears twice in one object (two parsers could disagree on
    which value was meant, so neither is taken)."""

    code = "MALFORMED_JSON"
    status = 400


class PayloadTooLarge(DomainError):
    code = "PAYLOAD_TOO_LARGE"
    status = 413


class TooManyRequests(DomainError):
    """Throttled: too many failed attempts from the caller's address; ``retry_after_s`` (also
    the ``Retry-After`` header) says when the window ends."""

    code = "TOO_MANY_REQUESTS"
    status = 429

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class DatabaseUnavailable(DomainError):
    """The database cannot be reached (refused, restarting, shut down by its administrator,
    out of connections): the call was not decided; send it again after ``Retry-After``."""

    code = "DATABASE_UNAVAILABLE"
    status = 503

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class Throttled(DomainError):
    """Flow control at dispatch (``ledger.services.authority.flow``): a concurrency or rate
    limit of the tenant's policy has no room for this dispatch now. Nothing was decided or
    recorded: the operation stays AUTHORIZED and the same dispatch may be sent again after
    ``retry_after_s`` (also the ``Retry-After`` header). ``key`` names the limit's key
    (``tenant``, ``tool:<name>``, ``provider:<name>`` or ``key:<flow_key>``) and ``limit``
    its kind (``concurrency`` or ``rate``)."""

    code = "THROTTLED"
    status = 409

    def __init__(self, detail: str, *, retry_after_s: int, key: str, limit: str) -> None:
        super().__init__(detail, retry_after_s=retry_after_s, key=key, limit=limit)
        self.retry_after_s = retry_after_s


class KeyUnavailable(DomainError):
    """A kept value is sealed under a key this server no longer holds (a user-content key
    removed from FENCELINE_USER_CONTENT_KEYS): nothing is wrong with the request."""

    code = "KEY_UNAVAILABLE"
    status = 503


class Forbidden(DomainError):
    """A person's role on the object's tenant does not allow this action (the console
    checks first; the service checks again)."""

    code = "FORBIDDEN"
    status = 403


class LeaseHeld(DomainError):
    code = "LEASE_HELD"
    status = 409


class LeaseLost(DomainError):
    """A renew or release by a caller who no longer owns the lease."""

    code = "LEASE_LOST"
    status = 409

    def __init__(self, reason: str) -> None:
        super().__init__(f"the lease is no longer yours: {reason.replace('_', ' ')}", reason=reason)
        self.reason = reason


class StaleToken(DomainError):
    """A write carrying a fencing token that is not the run's current, unexpired one."""

    code = "STALE_TOKEN"
    status = 409

    def __init__(self, reason: str) -> None:
        super().__init__(f"fencing token refused: {reason.replace('_', ' ')}", reason=reason)
        self.reason = reason


class WrongPhase(DomainError):
    code = "WRONG_PHASE"
    status = 409

    def __init__(self, *, phase: str, wanted: str, subject: str = "operation") -> None:
        """``subject`` names what is in the wrong phase: an operation, unless a worker's
        lifecycle (or a resource, a reservation ...) refused."""
        super().__init__(f"{subject} is {phase}; this call needs {wanted}", phase=phase)


class IdempotencyMismatch(DomainError):
    code = "IDEMPOTENCY_MISMATCH"
    status = 422


class EffectClassMismatch(DomainError):
    """The worker declared another side-effect class than the tool contract (or the policy's
    class for tools without one) gives: the contract decides, and the intent is refused."""

    code = "EFFECT_CLASS_MISMATCH"
    status = 422


class WorkerNotAccepting(DomainError):
    code = "WORKER_NOT_ACCEPTING"
    status = 409


class WorkerDraining(WorkerNotAccepting):
    """The worker is DRAINING: no new lease, no new intent, no dispatch of an operation not
    yet DISPATCHED (it stays for the replacement under the same idempotency key). Outcomes,
    checkpoints and resource releases are still accepted."""

    code = "WORKER_DRAINING"


def worker_refusal(status: str, what: str) -> WorkerNotAccepting:
    """The refusal of new work for a worker that is not ACCEPTING."""
    if status == "DRAINING":
        return WorkerDraining(f"the worker is draining and {what}")
    return WorkerNotAccepting(f"worker is {status} and {what}")


class NotReady(WorkerNotAccepting):
    """The worker's last boot reported a domain not ready: no lease until a boot is ready."""

    code = "NOT_READY"


class CredentialsNotReady(NotReady):
    """The worker's last boot reported only its credentials not ready (expired, unreadable)."""

    code = "CREDENTIALS_NOT_READY"


class UserContentRefused(DomainError):
    """User content (an event payload of class user_content) for a tenant that has not
    opted in to keep it (docs/architecture.md, "Data planes"); names ``payload_class``."""

    code = "USER_CONTENT_REFUSED"
    status = 403


class ForbiddenField(DomainError):
    """A forbidden key or a credential-like value crossed the secret boundary
    (``ledger/boundary/``). Names the path and the rule, never the value."""

    code = "FORBIDDEN_FIELD"
    status = 422

    def __init__(self, detail: str, *, path: str, rule: str) -> None:
        super().__init__(detail, path=path, rule=rule)
        self.path = path
        self.rule = rule


class RunCompleted(DomainError):
    code = "RUN_COMPLETED"
    status = 409


class RunCancelled(DomainError):
    """The run is cancelled or timed out (``run_status`` CANCELLING, CANCELLED or TIMED_OUT):
    no new intent, authorization, dispatch, retry or authority; once it has ended, no
    write at all. ``cancel_reason`` says why, ``grace_until`` until when in-flight effects
    may still report."""

    code = "RUN_CANCELLED"
    status = 409

    def __init__(self, *, run_status: str, ending: str, cancel_reason: str, grace_until: object = None) -> None:
        what = "being cancelled" if run_status == "CANCELLING" else run_status.lower().replace("_", " ")
        super().__init__(
            f"the run is {what}; it takes no new work",
            run_status=run_status,
            ending=ending,
            cancel_reason=cancel_reason,
            grace_until=grace_until,
        )


class Denied(DomainError):
    """An authority check refused: the code is DENY_REVOKED, DENY_EXPIRED,
    DENY_STALE_VERSION, DENY_ACTION, DENY_RESOURCE, DENY_NO_CAPABILITY, DENY_BUDGET or
    DENY_POLICY. A budget refusal names the budget in ``budget``."""

    status = 403

    def __init__(self, code: str, detail: str, *, field: str | None = None, **extra: object) -> None:
        super().__init__(detail, field=field, decision=code, **extra)
        self.code = code


class ApprovalRequired(DomainError):
    """Not an error for the caller: the decision waits for a person (HTTP 202)."""

    code = "APPROVAL_REQUIRED"
    status = 202

    def __init__(self, approval_id: object) -> None:
        super().__init__("a person must approve this first", decision="APPROVAL_REQUIRED", approval_id=str(approval_id))
        self.approval_id = approval_id

    def body(self) -> dict[str, object]:
        return {"decision": "APPROVAL_REQUIRED", "approval_id": str(self.approval_id)}


class BootIdReused(DomainError):
    """A boot report under a boot_id already reported with other content (a replay of the
    same report is answered as it was the first time)."""

    code = "BOOT_ID_REUSED"
    status = 409


class ReconcileFirst(DomainError):
    code = "RECONCILE_FIRST"
    status = 409


class AlreadyDelivered(DomainError):
    """A retry of a NON_RETRYABLE send whose message the provider reports DELIVERED or
    DEFERRED (it is delivered, or will be): sending again would deliver it twice.
    ``delivery_state`` and ``message_id`` name the evidence."""

    code = "ALREADY_DELIVERED"
    status = 409


class BadSignature(DomainError):
    """A provider webhook whose signature is missing, malformed, wrong or outside the
    source's tolerance window: nothing was read or written."""

    code = "BAD_SIGNATURE"
    status = 401


class UnknownSchemaVersion(DomainError):
    """A record or request names a schema version this build cannot read (invariant 9).

    A request naming an unknown version is the caller's error (422); a stored row written
    by a newer build is a conflict with the server's own state (409)."""

    code = "UNKNOWN_SCHEMA_VERSION"

    def __init__(self, version: object, what: str, *, known: frozenset[int], stored: bool = False) -> None:
        listed = ", ".join(str(v) for v in sorted(known))
        super().__init__(f"{what} has schema_version {version!r}; this build reads only {listed}")
        self.stored = stored
        self.status = 409 if stored else 422


class StateConflictError(DomainError):
    """A record of the run holds two representations that disagree (an upgrade window):
    automation on the run stops until a person decides which one is right (invariant 9's
    other half: never guess). Raised for every fenced call and lease of that run."""

    code = "STATE_CONFLICT"
    status = 409


class RestoreUnchecked(DomainError):
    """This database is a restored image whose fence has not been moved yet: no lease, no
    renewal and no fenced write until ``manage.py restore_check`` runs on it (the tokens it
    holds may have been issued again elsewhere, or be held by a worker still running).
    Nothing was decided; ``retry_after_s`` says when to ask again."""

    code = "RESTORE_UNCHECKED"
    status = 503

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class EffectsHeld(DomainError):
    """The tenant was restored from a backup: its workers may read, renew and write events,
    but no authorize or dispatch until a person allows effects (``manage.py allow_effects``
    or the console's upgrades page)."""

    code = "EFFECTS_HELD"
    status = 409


class UpgradeRefused(DomainError):
    """A move of a schema change (or a backfill) whose preconditions do not hold; the
    detail names what is in the way."""

    code = "UPGRADE_REFUSED"
    status = 409


def parse_id(raw: object, what: str) -> uuid.UUID:
    """A caller's id of a ``what``; an id that is not a UUID names nothing: NotFound."""
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        raise NotFound(f"{what} not found") from None
