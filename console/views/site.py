"""The console's own answers that no domain owns: a refused form (Django's CSRF check), the
sign-in and sign-out (Django's, with ``next`` judged as every console view judges it), a
throttled sign-in (django-axes) and the icon a browser asks for at ``/favicon.ico``."""

import math
from typing import Any

from axes.helpers import get_cool_off
from django.contrib.auth.views import LoginView, LogoutView, RedirectURLMixin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.templatetags.static import static
from django.views.decorators.http import require_GET

from console.views.common import next_url
from ledger.observability.metrics import THROTTLED

EXPIRED = "This page's form has expired (you signed out, or the console restarted with a new key). Nothing was changed: reload the page and try again."


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a page a person can act on instead of Django's debug text;
    for an htmx request the same sentence travels in ``X-Fenceline-Message`` for the toast
    that ``console.js`` shows (htmx swaps nothing on a 403)."""
    response = render(request, "csrf_failure.html", {"message": EXPIRED}, status=403)
    response["X-Fenceline-Message"] = EXPIRED
    return response


def sign_in_locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: 429 with ``Retry-After`` and the sign-in page's own layout
    saying when to try again. Each attempt during the lockout starts the cool-off again, so
    the wait is the whole cool-off from now."""
    cool_off = get_cool_off(request)
    retry_after_s = max(1, math.ceil(cool_off.total_seconds())) if cool_off else 0
    THROTTLED.labels(kind="console_login").inc()
    minutes = max(1, math.ceil(retry_after_s / 60))
    response = render(request, "registration/locked_out.html", {"minutes": minutes}, status=429)
    if retry_after_s:
        response["Retry-After"] = str(retry_after_s)
    return response


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    return HttpResponseRedirect(static("favicon.svg"))


class SameOriginNext(RedirectURLMixin):
    """Django's auth views follow ``next`` only when it is a path on this site (``next_url``),
    else their default page."""

    def get_redirect_url(self, request: HttpRequest | None = None) -> str:
        return next_url(request or self.request, "")  # type: ignore[attr-defined]  # the view's request


class SignIn(SameOriginNext, LoginView):
    """Django's sign-in page."""


class SignOut(SameOriginNext, LogoutView):
    """Django's sign-out (a POST)."""
