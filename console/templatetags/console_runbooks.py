"""The runbooks that apply to a case (its reason, its reconciler's latest verdict), as
sanitised HTML, read once per tenant per request."""

from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from ledger.admin_selectors import runbook_guides

register = template.Library()


def _guides(context: template.Context, tenant_id: int) -> dict[tuple[str, str], str]:
    request = context.get("request")
    cache: dict[int, dict[tuple[str, str], str]] = getattr(request, "_runbook_guides", None) or {}
    if request is not None:
        request._runbook_guides = cache
    if tenant_id not in cache:
        cache[tenant_id] = runbook_guides(tenant_id=tenant_id)
    return cache[tenant_id]


@register.simple_tag(takes_context=True)
def case_runbooks(context: template.Context, case: Any) -> list[dict[str, str | SafeString]]:
    """[{subject, name, html}] for ``case``: the runbook for its reason, then the one for its
    latest lookup's verdict (each only when the tenant wrote it)."""
    guides = _guides(context, case.tenant_id)
    wanted = [("reason", str(case.reason))]
    history = case.lookup_history or []
    if history and isinstance(history[-1], dict) and history[-1].get("verdict"):
        wanted.append(("verdict", str(history[-1]["verdict"])))
    return [
        # runbook_html's output is nh3's allow-listed HTML (ledger/services/tenancy/runbooks.py)
        {"subject": subject, "name": name, "html": mark_safe(guides[(subject, name)])}  # noqa: S308
        for subject, name in wanted
        if (subject, name) in guides
    ]
