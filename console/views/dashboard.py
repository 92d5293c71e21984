"""The dashboard: counts that need a person now, in the tenants where the user has a role."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.vary import vary_on_headers

from ledger import selectors
from ledger.observability import health


@login_required
@vary_on_headers("HX-Request")
def home(request):
    """What needs a person now. htmx polls the same URL and gets only the counts partial."""
    partial = request.htmx and not request.htmx.history_restore_request
    template = "console/home.html#counts" if partial else "console/home.html"
    context = {"counts": selectors.dashboard_counts(user=request.user), "jobs": health.jobs_freshness()}
    return render(request, template, context)
