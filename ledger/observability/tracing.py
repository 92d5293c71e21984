"""Trace context: the caller's W3C ``traceparent`` kept with what its call writes, and
OpenTelemetry spans for API requests and Celery jobs.

Every request may carry ``traceparent`` (W3C Trace Context, read by OpenTelemetry's own
propagator). Its trace id is this request's :func:`current_trace_id` while the request runs
(``console.middleware.RequestObservationMiddleware`` sets it): an operation intended under it
keeps it (``Operation.trace_id``), every chain event the call writes carries it in its
fields as ``trace_id`` (an optional field: events without it hash as before, so existing
chains verify unchanged), and the request's log line names it. A header that is not a valid
traceparent is ignored, as the W3C specification asks (the call is not refused for it).

Spans are made only where a deployment asks for them: with ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_TRACES_EXPORTER=otlp``) set, :func:`setup_tracing` — called by the WSGI/ASGI
entry points and the Celery app before anything else loads — installs the SDK's tracer
provider with a batching OTLP/HTTP exporter and instruments Django (a server span per
request, continuing the caller's trace) and Celery (a span per job). The standard OTEL_*
variables configure the exporter and the service name (default ``fenceline``). A request
span names its URL by the route *pattern* only, never the path or the query, which may carry
what the secret boundary refuses (``_url_by_route``), as the request log does.
"""

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACE_FIELD = "trace_id"  # the chain events' optional field
_PROPAGATOR = TraceContextTextMapPropagator()
_trace_id: contextvars.ContextVar[str] = contextvars.ContextVar("fenceline_trace_id", default="")


def trace_id_of(traceparent: str | None) -> str:
    """The 32 lowercase hex digits of a valid ``traceparent``'s trace id, or ''."""
    if not traceparent:
        return ""
    context = _PROPAGATOR.extract({"traceparent": traceparent})
    span = trace.get_current_span(context).get_span_context()
    return format(span.trace_id, "032x") if span.is_valid else ""


def current_trace_id() -> str:
    """The trace id of the call being served ('' outside one, or when the caller sent none)."""
    return _trace_id.get()


@contextmanager
def traced(traceparent: str | None) -> Iterator[str]:
    """Within the block, :func:`current_trace_id` is ``traceparent``'s trace id."""
    token = _trace_id.set(trace_id_of(traceparent))
    try:
        yield _trace_id.get()
    finally:
        _trace_id.reset(token)


def tracing_configured() -> bool:
    """Whether the environment asks for spans to be exported."""
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_TRACES_EXPORTER") == "otlp")


_installed: list[TracerProvider] = []


def setup_tracing(exporter: SpanExporter | None = None) -> TracerProvider | None:
    """Install the tracer provider and instrument Django and Celery, once per process: with
    ``exporter`` (a test's in-memory one) or, when :func:`tracing_configured`, OTLP/HTTP.
    Returns the provider, or None when nothing is configured."""
    if _installed:
        return _installed[0]
    if exporter is None:
        if not tracing_configured():
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    service = os.environ.get("OTEL_SERVICE_NAME", "fenceline")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument(tracer_provider=provider, response_hook=_url_by_route)
    CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    _installed.append(provider)
    return provider


# The span attributes (old and new HTTP semantic conventions) that carry the request's URL.
_URL_ATTRIBUTES = ("http.url", "http.target", "url.full", "url.path", "url.query")


def _url_by_route(span: trace.Span, request: Any, response: Any) -> None:
    """The instrumentation's response hook: every URL attribute becomes the route pattern."""
    match = getattr(request, "resolver_match", None)
    route = "/" + match.route if match is not None else "unmatched"
    for name in _URL_ATTRIBUTES:
        span.set_attribute(name, "" if name == "url.query" else route)
