"""What a load balancer, an orchestrator and Prometheus ask: ``/healthz`` (the process
answers), ``/readyz`` (each domain of the control plane: 503 naming a failing one the API
needs, 200 "degraded" naming one that only delays background work), ``/readyz/jobs`` (503 when
background work is held up: the broker, a stale job) and ``/metrics`` (Prometheus text; a
scrape token, or an allowed client address when no proxy is declared; per-tenant series only
for the tenant scrape token, totals for the others)."""

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ledger.observability import health, metrics


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _checks(checks: list[health.Check]) -> dict[str, dict[str, object]]:
    return {c.domain: {"ok": c.ok, **({"reason": c.reason} if c.reason else {}), **c.detail} for c in checks}


@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """503 only for what stops the API; the broker and the jobs read "degraded" with 200."""
    checks = health.readiness()
    failing = [c.domain for c in checks if not c.ok and c.domain in health.SERVING]
    degraded = [c.domain for c in checks if not c.ok and c.domain in health.BACKGROUND]
    status = "not_ready" if failing else "degraded" if degraded else "ready"
    body = {"status": status, "failing": failing, "degraded": degraded, "checks": _checks(checks)}
    return JsonResponse(body, status=503 if failing else 200)


@require_GET
@never_cache
def readyz_jobs(request: HttpRequest) -> JsonResponse:
    """503 when background work is held up (the broker, a stale job): for job monitoring."""
    checks = health.background_readiness()
    failing = [c.domain for c in checks if not c.ok]
    body = {"status": "not_ready" if failing else "ready", "failing": failing, "checks": _checks(checks)}
    return JsonResponse(body, status=503 if failing else 200)


def _bearer(request: HttpRequest, token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return (
        bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())
    )


def _scrape_scope(request: HttpRequest) -> bool | HttpResponse:
    """Whether this scraper sees per-tenant series (True) or only totals (False), or the
    refusal. Behind a declared proxy every client may look like the proxy's own address, so
    there a token is required even when none is configured (then nobody may scrape)."""
    fl = settings.FENCELINE
    if _bearer(request, fl["METRICS_TENANT_TOKEN"]):
        return True
    if _bearer(request, fl["METRICS_TOKEN"]):
        return False
    if fl["METRICS_TENANT_TOKEN"] or fl["METRICS_TOKEN"]:
        refused = JsonResponse({"error": "UNAUTHENTICATED", "detail": "a scrape token is required"}, status=401)
        refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return refused
    if settings.SECURE_PROXY_SSL_HEADER is not None or settings.USE_X_FORWARDED_HOST:
        detail = "behind a proxy (FENCELINE_BEHIND_TLS_PROXY) /metrics needs FENCELINE_METRICS_TOKEN"
        return JsonResponse({"error": "FORBIDDEN", "detail": detail}, status=403)
    if request.META.get("REMOTE_ADDR") in fl["METRICS_ALLOW"]:
        return False
    detail = "set FENCELINE_METRICS_TOKEN, or scrape from an address in FENCELINE_METRICS_ALLOW"
    return JsonResponse({"error": "FORBIDDEN", "detail": detail}, status=403)


@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    scope = _scrape_scope(request)
    if isinstance(scope, HttpResponse):
        return scope
    return HttpResponse(metrics.scrape(per_tenant=scope), content_type=metrics.CONTENT_TYPE)
