"""Every refusal of the worker API is {"error": CODE, "detail": "..."} with a 4xx status.

Domain errors are mapped to statuses here and nowhere else. Messages never echo what the
caller sent: validation errors name the field and the rule, not the value.
"""

import logging

from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from ledger.boundary import path_segment
from ledger.services import errors as domain

log = logging.getLogger("fenceline.api")

STATUS = {
    domain.NotFound: 404,
    domain.InvalidInput: 422,
    domain.Forbidden: 403,
    domain.ForbiddenField: 422,
    domain.IdempotencyMismatch: 422,
    domain.LeaseHeld: 409,
    domain.LeaseLost: 409,
    domain.StaleToken: 409,
    domain.WrongPhase: 409,
    domain.WorkerNotAccepting: 409,
    domain.RunCompleted: 409,
    domain.Denied: 403,
    domain.ApprovalRequired: 202,
    domain.ReconcileFirst: 409,
}


def status_for(exc: domain.DomainError) -> int:
    """The HTTP status of a domain error (the one table above; 400 for any other)."""
    return next((s for cls, s in STATUS.items() if isinstance(exc, cls)), 400)


class MalformedBody(ValueError):
    """The request body is not a JSON object."""


def refusal(api: NinjaAPI, request, status: int, code: str, detail: str, **extra):
    return api.create_response(request, {"error": code, "detail": detail, **extra}, status=status)


def _field_path(loc: tuple) -> str:
    # An unknown key is named only if it looks like a field name (never a credential).
    parts = [path_segment(str(p)) for p in loc if p not in ("body", "payload", "query", "path")]
    return ".".join(parts) or "body"


def install(api: NinjaAPI) -> None:
    @api.exception_handler(domain.DomainError)
    def on_domain_error(request, exc: domain.DomainError):
        status = status_for(exc)
        extra = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in exc.extra.items()}
        if isinstance(exc, domain.ApprovalRequired):  # 202: a decision, not an error
            return api.create_response(request, {"decision": "APPROVAL_REQUIRED", "approval_id": extra["approval_id"]}, status=202)
        return refusal(api, request, status, exc.code, exc.detail, **extra)

    @api.exception_handler(domain.UnknownSchemaVersion)
    def on_unknown_version(request, exc: domain.UnknownSchemaVersion):
        # A request naming an unknown version is the caller's error (422); a stored row
        # written by a newer build is a conflict with the server's own state (409).
        return refusal(api, request, 409 if exc.stored else 422, exc.code, exc.detail)

    @api.exception_handler(ValidationError)
    def on_validation_error(request, exc: ValidationError):
        problems = [
            {"field": _field_path(tuple(err.get("loc", ()))), "problem": err.get("msg", "invalid")}
            for err in exc.errors
        ]
        summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems[:5])
        return refusal(api, request, 422, "VALIDATION_ERROR", summary or "invalid request", fields=problems)

    @api.exception_handler(AuthenticationError)
    def on_unauthenticated(request, exc):
        return refusal(api, request, 401, "UNAUTHORIZED", "a valid worker bearer token is required")

    @api.exception_handler(HttpError)
    def on_http_error(request, exc: HttpError):
        if exc.status_code == 400 and exc.__cause__ is not None:
            return refusal(api, request, 400, "MALFORMED_JSON", "the request body must be a JSON object")
        return refusal(api, request, exc.status_code, "HTTP_ERROR", str(exc.message))

    @api.exception_handler(Exception)
    def on_unexpected(request, exc: Exception):
        # The exception's message may carry input; log only its type.
        log.error("unhandled %s in %s %s", type(exc).__name__, request.method, request.path)
        return refusal(api, request, 500, "INTERNAL", "internal error")
