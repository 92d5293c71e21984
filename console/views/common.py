"""What the console's views share: the tenant an action names (visible, else 404; the role,
else 403), and the two ways an action answers — on an admin page a toast and back to the
page, on a decision queue the refreshed table with one out-of-band toast. A refusal answers
with the status its domain error carries (``ledger.errors``), as the worker API does; a
form's own errors are bad input too and answer like ``InvalidInput``."""

import uuid
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import unquote

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.middleware import HtmxDetails

from approvals.models import ApprovalRequest, ReconciliationCase
from ledger.admin_selectors import visible_tenants
from ledger.errors import DomainError, InvalidInput
from ledger.models import Tenant
from ledger.roles import can

BAD_INPUT = InvalidInput.status  # a form that does not validate is refused like the service would


class HtmxHttpRequest(HttpRequest):
    """The request every console view receives: ``HtmxMiddleware`` sets ``htmx`` on each
    one (django-htmx's documented annotation; it is never instantiated)."""

    htmx: HtmxDetails


def chosen(request: HttpRequest, name: str, allowed: Collection[str], default: str) -> tuple[str, str]:
    """The value of the list filter ``name`` in the query string, matched case-insensitively
    against ``allowed``, and a notice for one that is none of them (the list then shows
    ``default``, and says so: never a silent fallback). An empty or absent value is the
    default, without a notice."""
    raw = request.GET.get(name, "").strip()
    if not raw:
        return default, ""
    by_lower = {value.lower(): value for value in allowed}
    value = by_lower.get(raw.lower())
    if value is not None:
        return value, ""
    shown = raw if len(raw) <= 40 and raw.isprintable() else raw[:40] + "…"
    return default, f"There is no {name} “{shown}”: showing {default} instead. Choose one of: {', '.join(allowed)}."


def tenant_for_action(request: HttpRequest, slug: str, perm: str) -> Tenant:
    """The tenant named by ``slug``: 404 unless the user sees it, 403 without ``perm``."""
    tenant = get_object_or_404(visible_tenants(user=request.user), slug=slug or "")
    if not can(request.user, tenant, perm):
        raise PermissionDenied("your role on this tenant does not allow this action")
    return tenant


def form_errors(form: forms.Form) -> str:
    """A form's errors as one line: ``field name: message; ...``."""
    return "; ".join(
        " ".join(map(str, errs)) if name == "__all__" else f"{name.replace('_', ' ')}: {' '.join(map(str, errs))}"
        for name, errs in form.errors.items()
    )


def refused_field(exc: DomainError) -> str:
    """The field a service's refusal names (``fields[0].field``), or ""."""
    fields = exc.extra.get("fields")
    first = fields[0] if isinstance(fields, list) and fields else None
    return str(first.get("field", "")) if isinstance(first, dict) else ""


def _same_origin_path(url: str) -> bool:
    """``url`` is a path on this site: it starts with one ``/``, names no scheme or host,
    and holds no backslash, control character or space, as written or percent-decoded."""
    for form in (url, unquote(url)):
        if not form.startswith("/") or form.startswith("//") or "\\" in form:
            return False
        if any(ch.isspace() or not ch.isprintable() for ch in form):
            return False
        if not url_has_allowed_host_and_scheme(form, allowed_hosts=None):
            return False
    return True


def next_url(request: HttpRequest, default: str) -> str:
    """Where ``next`` (posted, else in the query string) sends the user after an action: a
    same-origin path, or ``default`` for anything else (another site, ``//host``,
    ``javascript:``, an encoded variant) — so a committed action always redirects."""
    url = request.POST.get("next") or request.GET.get("next") or ""
    return url if len(url) <= 2000 and _same_origin_path(url) else default


def done(request: HttpRequest, message: str, to: str, *, error: bool = False) -> HttpResponse:
    """After a POST: a toast, and back to ``to`` (POST/redirect/GET, with or without htmx)."""
    (messages.error if error else messages.success)(request, message)
    return redirect(to)


def queue_answer(
    request: HtmxHttpRequest,
    *,
    template: str,
    context: Callable[[], dict[str, Any]],
    message: str,
    back_to: str,
    error: bool = False,
    status: int = 200,
) -> HttpResponse:
    """After an action on a decision queue: htmx gets the refreshed table and one
    out-of-band toast (an error swaps nothing else); a plain form post is redirected back
    to ``back_to``, or shown the page with the error and its ``status``."""
    if request.htmx:
        response = render(request, f"{template}#action-response", {**context(), "toast": message, "toast_error": error})
        if error:
            response["HX-Reswap"] = "none"
        return response
    if error:
        return render(request, template, {**context(), "errors": [message]}, status=status)
    return redirect(back_to)


def selected_for_action[M: (ApprovalRequest, ReconciliationCase)](
    request: HttpRequest, visible: QuerySet[M], ids: list[str], perm: str, what: str
) -> list[M]:
    """The objects a bulk form names, among ``visible`` (what the user sees): every one of
    them or 404 (an id that is no UUID names nothing either), and each of a tenant where the
    user holds ``perm``, or 403."""
    try:
        keys = [uuid.UUID(value) for value in ids]
    except ValueError:
        raise Http404(f"{what} not found") from None
    found = list(visible.filter(pk__in=keys).select_related("tenant"))
    if len(found) != len(set(keys)):
        raise Http404(f"{what} not found")
    if any(not can(request.user, item.tenant, perm) for item in found):
        raise PermissionDenied("your role on this tenant does not allow this action")
    return found


def bulk_preview(
    request: HtmxHttpRequest,
    template: str,
    preview: dict[str, Any],
    queue_context: Callable[[], dict[str, Any]],
) -> HttpResponse:
    """A bulk form's first answer: exactly what it would touch (the preview partial under
    htmx; without it, the whole queue page with the preview in it)."""
    if request.htmx:
        return render(request, f"{template}#bulk-preview", preview)
    return render(request, template, {**preview, **queue_context()})
