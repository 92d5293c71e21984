"""What a load balancer, an orchestrator and Prometheus ask: ``/healthz`` (the process
answers), ``/readyz`` (each domain of the control plane, 503 naming the failing one) and
``/metrics`` (Prometheus text; a scrape token, or an allowed client address)."""

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


@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    checks = health.readiness()
    failing = [c.domain for c in checks if not c.ok]
    body = {
        "status": "not_ready" if failing else "ready",
        "failing": failing,
        "checks": {c.domain: {"ok": c.ok, **({"reason": c.reason} if c.reason else {}), **c.detail} for c in checks},
    }
    return JsonResponse(body, status=503 if failing else 200)


def _scrape_refusal(request: HttpRequest) -> HttpResponse | None:
    token = settings.FENCELINE["METRICS_TOKEN"]
    if token:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode()):
            return None
        refused = JsonResponse({"error": "UNAUTHENTICATED", "detail": "a scrape token is required"}, status=401)
        refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return refused
    if request.META.get("REMOTE_ADDR") in settings.FENCELINE["METRICS_ALLOW"]:
        return None
    detail = "set FENCELINE_METRICS_TOKEN, or scrape from an address in FENCELINE_METRICS_ALLOW"
    return JsonResponse({"error": "FORBIDDEN", "detail": detail}, status=403)


@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = _scrape_refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(metrics.scrape(), content_type=metrics.CONTENT_TYPE)
