"""What the admin pages share: the tenant an action names (visible, else 404; the role,
else 403), and the one way an action answers (a toast, then back to the page)."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect

from ledger.admin_selectors import visible_tenants
from ledger.api.errors import status_for
from ledger.roles import can
from ledger.services.errors import DomainError, ForbiddenField, InvalidInput


def tenant_for_action(request, slug: str, perm: str):
    """The tenant named by ``slug``: 404 unless the user sees it, 403 without ``perm``."""
    tenant = get_object_or_404(visible_tenants(user=request.user), slug=slug or "")
    if not can(request.user, tenant, perm):
        raise PermissionDenied("your role on this tenant does not allow this action")
    return tenant


def form_errors(form) -> str:
    return "; ".join(f"{name}: {' '.join(errs)}" if name != "__all__" else " ".join(errs) for name, errs in form.errors.items())


def done(request, message: str, to: str, *, error: bool = False):
    """After a POST: a toast, and back to ``to`` (POST/redirect/GET, with or without htmx)."""
    (messages.error if error else messages.success)(request, message)
    return redirect(to)


def refusal_status(exc: DomainError) -> int:
    """A refused console action: bad input is 400, like the form's own errors (the API says
    422); everything else has the API's status (404, 403, 409)."""
    return 400 if isinstance(exc, InvalidInput | ForbiddenField) else status_for(exc)
