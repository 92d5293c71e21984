"""The console's own answers that no domain owns: a refused form (Django's CSRF check) and
the icon a browser asks for at ``/favicon.ico``."""

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.templatetags.static import static
from django.views.decorators.http import require_GET

EXPIRED = "This page's form has expired (you signed out, or the console restarted with a new key). Nothing was changed: reload the page and try again."


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a page a person can act on instead of Django's debug text;
    for an htmx request the same sentence travels in ``X-Fenceline-Message`` for the toast
    that ``console.js`` shows (htmx swaps nothing on a 403)."""
    response = render(request, "csrf_failure.html", {"message": EXPIRED}, status=403)
    response["X-Fenceline-Message"] = EXPIRED
    return response


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    return HttpResponseRedirect(static("favicon.svg"))
