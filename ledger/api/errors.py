"""Every refusal of the worker API is {"error": CODE, "detail": "..."} with a 4xx status, or
503 DATABASE_UNAVAILABLE with ``Retry-After`` while the database cannot be reached.

A domain error (``ledger.errors``) carries its own code and status; this module only
writes it out. Messages never echo what the caller sent: validation errors name the field
and the rule, not the value.
"""

import logging
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, UnreadablePostError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from ledger.boundary import path_segment
from ledger.errors import (
    DatabaseUnavailable,
    DomainError,
    LeaseLost,
    MalformedJSON,
    PayloadTooLarge,
    StaleToken,
)
from ledger.observability.health import database_unreachable
from ledger.services.fleet.stale_tokens import worker_stale_rejected

log = logging.getLogger("fenceline.api")


def refusal(api: NinjaAPI, request: HttpRequest, status: int, code: str, detail: str, **extra: Any) -> HttpResponse:
    return api.create_response(request, {"error": code, "detail": detail, **extra}, status=status)


# An unknown key is the caller's own text: it is named only when it reads as a field name
# (lower-case words joined by underscores, as every field of this API is) and passes the
# secret boundary; anything else (digits, capitals, punctuation: a token, a password) reads "*".
_FIELD_NAME = re.compile(r"[a-z]{1,20}(?:_[a-z]{1,20}){0,4}")


def _field_path(error: dict[str, Any]) -> str:
    """The field of a validation error as a dotted path (``ledger.boundary.path_segment``
    for each segment); an unknown key as ``_FIELD_NAME`` allows."""
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "payload", "query", "path")]
    if error.get("type") == "extra_forbidden" and loc and not _FIELD_NAME.fullmatch(loc[-1]):
        loc[-1] = "*"
    return ".".join(path_segment(p) for p in loc) or "body"


def _problem(error: dict[str, Any], field: str) -> str:
    """The rule a field broke, in words. An unknown key is named (when it may be shown)."""
    if error.get("type") != "extra_forbidden":
        return str(error.get("msg", "invalid"))
    key = field.rsplit(".", 1)[-1]
    if key == "*":
        return "a key this call does not take (not shown: it does not read as a field name)"
    return f"{key!r} is not a field this call takes (see docs/api.md)"


def _body_missing(request: HttpRequest, exc: ValidationError) -> bool:
    """An empty body where the endpoint takes one: ninja does not hand it to the parser and
    reports the body's fields missing; it is malformed JSON (an empty text is not JSON)."""
    return not request.body and any(tuple(err.get("loc", ()))[:1] == ("body",) for err in exc.errors)


def install(api: NinjaAPI) -> None:
    @api.exception_handler(DomainError)
    def on_domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
        worker = getattr(request, "worker", None)
        if isinstance(exc, (StaleToken, LeaseLost)) and worker is not None:
            worker_stale_rejected(worker=worker)  # past the policy's limit: quarantined, told to stop
        response = api.create_response(request, exc.body(), status=exc.status)
        if exc.retry_after_s is not None:
            response["Retry-After"] = str(exc.retry_after_s)
        return response

    @api.exception_handler(ValidationError)
    def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        if _body_missing(request, exc):
            return on_domain_error(request, MalformedJSON("the request body is empty; it must be a JSON object"))
        fields = [_field_path(err) for err in exc.errors]
        problems = [{"field": f, "problem": _problem(err, f)} for err, f in zip(exc.errors, fields, strict=True)]
        summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems[:5])
        return refusal(api, request, 422, "VALIDATION_ERROR", summary or "invalid request", fields=problems)

    @api.exception_handler(AuthenticationError)
    def on_unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return refusal(api, request, 401, "UNAUTHORIZED", "a valid worker bearer token is required")

    @api.exception_handler(OperationalError)
    @api.exception_handler(InterfaceError)
    def on_database_error(request: HttpRequest, exc: Exception) -> HttpResponse:
        if not database_unreachable(exc):
            return _unexpected(api, request, exc)
        return on_domain_error(request, _database_unavailable(request, exc))

    @api.exception_handler(Exception)
    def on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
        return _unexpected(api, request, exc)

    _install_body_errors(api, on_domain_error)


def _install_body_errors(api: NinjaAPI, answer: Callable[[HttpRequest, DomainError], HttpResponse]) -> None:
    """A body the API cannot take as it arrived: malformed, too large, cut short."""

    @api.exception_handler(HttpError)
    def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        # Ninja wraps what the body parser (ledger/api/body.py) raises in a 400 HttpError.
        cause = exc.__cause__
        if isinstance(cause, DomainError):
            return answer(request, cause)
        if exc.status_code == 400 and cause is not None:
            return answer(request, MalformedJSON("the request body must be a JSON object"))
        return refusal(api, request, exc.status_code, "HTTP_ERROR", str(exc.message))

    @api.exception_handler(RequestDataTooBig)
    def on_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return answer(request, PayloadTooLarge(f"the request body is larger than {limit} bytes"))

    @api.exception_handler(UnreadablePostError)
    def on_body_not_received(request: HttpRequest, exc: UnreadablePostError) -> HttpResponse:
        # The client stopped sending its body (console/serving.py bounds each read).
        return answer(request, MalformedJSON("the request body was not received in full"))


def _database_unavailable(request: HttpRequest, exc: Exception) -> DatabaseUnavailable:
    """The database is away (not the request wrong, not the server broken): 503 with Retry-After."""
    log.warning("database unreachable (%s) in %s %s", type(exc.__cause__ or exc).__name__, request.method, request.path)
    return DatabaseUnavailable(
        "the database cannot be reached: send the call again after Retry-After seconds",
        retry_after_s=settings.FENCELINE["OUTAGE_RETRY_AFTER_S"],
    )


def _unexpected(api: NinjaAPI, request: HttpRequest, exc: Exception) -> HttpResponse:
    # The exception's message may carry input; log only its type.
    log.error("unhandled %s in %s %s", type(exc).__name__, request.method, request.path)
    return refusal(api, request, 500, "INTERNAL", "internal error")
