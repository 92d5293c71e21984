"""URLs and console forms pass the secret boundary before anything else sees them (invariant 6).

A path or query string that carries a credential-like value (``ledger.boundary``, judged in
its normal form: ``ledger/boundary/normal.py``) is refused with 422 before routing,
authentication or any log line: Django's "Not Found: <path>" and its request-status lines
never get to print it. So is a console form (any POST outside the API) whose fields carry one,
alone or split across two fields (``ledger.boundary.check_texts``), before any view stores it;
password fields (the sign-in form's, a new user's) are credentials by design and never stored
as sent, so they are not judged. The refusal names the part of the request and the rule,
never the value; the API answers with its JSON error body, the console with a short page. The
log line it writes has no path. (The API's JSON bodies are judged by its body parser,
``ledger/api/body.py``.)
"""

import json
import logging
import time
from collections.abc import Callable
from urllib.parse import urlencode

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
    UnreadablePostError,
)
from django.shortcuts import render
from django.template.loader import render_to_string
from django_htmx.http import HttpResponseClientRedirect

from ledger.boundary import check_texts, credential_kind
from ledger.errors import ForbiddenField
from ledger.observability import health, logs, metrics, tracing

log = logging.getLogger("fenceline.boundary")

API_PREFIX = "/api/"


def url_refusal(request: HttpRequest) -> tuple[str, str] | None:
    """(part, rule) of the first credential-like part of the request's URL, or None."""
    query = request.META.get("QUERY_STRING", "")
    for part, text in (("url.path", request.path), ("url.query", query)):
        kind = credential_kind(text, remember=False) if text else None
        if kind is not None:
            return part, kind.replace("_", " ")
    # The query's values together: a credential split across two parameters.
    return _texts_refusal([("url.query", value) for _, values in request.GET.lists() for value in values])


def _texts_refusal(texts: list[tuple[str, str]]) -> tuple[str, str] | None:
    try:
        check_texts(texts)
    except ForbiddenField as refused:
        return refused.path, "credential-like value"
    return None


NOT_JUDGED = ("password", "csrfmiddlewaretoken")  # field names containing these


def form_refusal(request: HttpRequest) -> tuple[str, str] | None:
    """(part, rule) of a console form whose fields carry a credential-like value, or None."""
    if request.method != "POST" or request.path.startswith(API_PREFIX):
        return None
    try:
        fields = [
            (f"form.{name}", value)
            for name, values in request.POST.lists()
            if not any(word in name.lower() for word in NOT_JUDGED)
            for value in values
        ]
    except RequestDataTooBig:
        return None  # the view answers that
    except UnreadablePostError:
        return None  # the body never arrived whole: nothing to judge, and the CSRF check refuses the form
    return _texts_refusal(fields)


class URLBoundaryMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = url_refusal(request)
        if refused is None:
            refused = form_refusal(request)
        if refused is None:
            return self.get_response(request)
        part, rule = refused
        url = part.startswith("url.")
        where = f"the {part.removeprefix('url.')} of the URL" if url else f"the form field {part.removeprefix('form.')}"
        detail = f"A credential-like value in {where} ({rule})"
        log.warning("refused %s %s: a credential-like value (%s; withheld)", request.method, part, rule)
        response: HttpResponse
        if request.path.startswith(API_PREFIX):
            body = {"error": "FORBIDDEN_FIELD", "detail": detail, "path": part, "rule": "credential-like value"}
            response = JsonResponse(body, status=422)
        else:
            # A form's field is named as the console's forms name theirs (errors, error_field).
            field = part.removeprefix("form.") if part.startswith("form.") else ""
            context = {"detail": detail, "errors": [detail] if field else [], "error_field": field}
            response = render(request, "refused.html", context, status=422)
        response._has_been_logged = True  # type: ignore[attr-defined]  # django.request would print the path
        return response


request_log = logging.getLogger("fenceline.request")


def _error_code(response: HttpResponse) -> str:
    """The API's error code of a refusal (``{"error": CODE, ...}``), else ""."""
    if response.status_code < 400 or not response.get("Content-Type", "").startswith("application/json"):
        return ""
    try:
        code = json.loads(response.content).get("error", "")
    except (ValueError, AttributeError):
        return ""
    return code if isinstance(code, str) and code.isupper() and len(code) <= 40 else ""


class RequestObservationMiddleware:
    """Outermost: one JSON log line per request and its latency in
    ``fenceline_http_request_duration_seconds``, labelled by the URL *pattern* (never the path,
    which may carry what the URL boundary refuses) and the status code. The request id — the
    caller's ``X-Request-ID`` when it looks like one — is answered in the same header. A W3C
    ``traceparent`` makes its trace id the request's (``ledger.observability.tracing``): kept
    with what the call writes and named in the log line."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        rid = logs.request_id(request.headers.get("X-Request-ID"))
        with tracing.traced(request.headers.get("traceparent")) as trace_id:
            response = self.get_response(request)
        elapsed = time.perf_counter() - started
        match = request.resolver_match
        route = match.route if match is not None else "unmatched"
        metrics.REQUEST_SECONDS.labels(route, request.method, str(response.status_code)).observe(elapsed)
        response["X-Request-ID"] = rid
        kwargs = match.kwargs if match is not None else {}
        worker = getattr(request, "worker", None)
        fields = {
            "request_id": rid,
            "trace_id": trace_id,
            "method": request.method,
            "route": route,
            "status": response.status_code,
            "code": _error_code(response),
            "duration_ms": round(elapsed * 1000, 2),
            "tenant": worker.tenant.slug if worker is not None else "",
            "worker": worker.name if worker is not None else "",
            "run": str(kwargs.get("run_id", ""))[:64],
            "operation": str(kwargs.get("operation_id", ""))[:64],
        }
        request_log.info("%s %s %s", request.method, route, response.status_code, extra=fields)
        return response


outage_log = logging.getLogger("fenceline.outage")


class DatabaseUnavailableMiddleware:
    """A console page whose view cannot reach the database answers a plain 503 page with
    ``Retry-After`` (rendered without the request: the layout reads the user, which needs the
    database). The worker API answers its own JSON body (ledger/api/errors.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not health.database_unreachable(exception):
            return None
        outage_log.warning(
            "database unreachable (%s) in %s", type(exception.__cause__ or exception).__name__, request.method
        )
        retry_after_s = settings.FENCELINE["OUTAGE_RETRY_AFTER_S"]
        page = render_to_string("503.html", {"retry_after_s": retry_after_s})
        response = HttpResponse(page, status=503)
        response["Retry-After"] = str(retry_after_s)
        return response


class ConsoleAnswerMiddleware:
    """Two console answers a browser would otherwise show badly (after django-htmx's
    middleware, so ``request.htmx`` and ``request.user`` are there):

    - an htmx request from a session that has ended gets the sign-in redirect as
      ``HX-Redirect`` (the whole browser goes to the sign-in page, then back to the page it was
      on), instead of htmx following the 302 and swapping the sign-in page into a card;
    - a console action URL asked with the wrong method (a GET of ``/cases/<id>/claim``) gets
      the console's 405 page saying the action is a button, not an empty 405.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith(API_PREFIX):
            return response
        if getattr(request, "htmx", False) and _to_sign_in(response):
            return _sign_in_again(request)
        if isinstance(response, HttpResponseNotAllowed) and not response.content:
            page = render(request, "405.html", {"allowed": response["Allow"]}, status=405)
            page["Allow"] = response["Allow"]
            return page
        return response


def _to_sign_in(response: HttpResponse) -> bool:
    return isinstance(response, HttpResponseRedirect) and response["Location"].startswith(settings.LOGIN_URL)


def _sign_in_again(request: HttpRequest) -> HttpResponse:
    """The sign-in page for the whole browser, coming back to the page the person was on."""
    back = request.htmx.current_url_abs_path or "/"  # type: ignore[attr-defined]  # django-htmx sets it
    return HttpResponseClientRedirect(f"{settings.LOGIN_URL}?{urlencode({'next': back})}")
