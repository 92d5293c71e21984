"""The dashboard: counts that need a person now, and the trends of the last 24 hours, in
the tenants where the user has a role."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.vary import vary_on_headers

from approvals import selectors
from console.views.common import HtmxHttpRequest
from ledger.observability import health


@login_required
@vary_on_headers("HX-Request", "HX-Target")
def home(request: HtmxHttpRequest) -> HttpResponse:
    """What needs a person now. htmx polls the same URL: the counts partial every 10 s, and
    the trends partial (the request targets ``#trends``) every minute."""
    if request.htmx and not request.htmx.history_restore_request:
        if request.htmx.target == "trends":
            return render(
                request, "console/home.html#trends", {"trends": selectors.dashboard_trends(user=request.user)}
            )
        context = {"counts": selectors.dashboard_counts(user=request.user), "jobs": health.jobs_freshness()}
        return render(request, "console/home.html#counts", context)
    context = {
        "counts": selectors.dashboard_counts(user=request.user),
        "jobs": health.jobs_freshness(),
        "trends": selectors.dashboard_trends(user=request.user),
    }
    return render(request, "console/home.html", context)
