"""Runbooks: a tenant's guidance per case reason and per reconciler verdict, in Markdown,
set by its admins (each change an AdminAction with who and why) and shown on every case it
applies to. The text passes the secret boundary when written; it is rendered with raw HTML
off (markdown-it-py's CommonMark, which already refuses ``javascript:`` links) and the
result cleaned again by an allow-list (nh3): no script, no event handler attribute, no
image, links only to http(s) and mailto, each ``rel="noopener noreferrer nofollow"``."""

from typing import Any

import nh3
from django.db import transaction
from django.utils import timezone
from markdown_it import MarkdownIt

from ledger.actors import user_actor
from ledger.boundary import check_text
from ledger.errors import InvalidInput
from ledger.models import Runbook, Tenant
from ledger.models.runbooks import RunbookSubject
from ledger.roles import ADMINISTER
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.reconciliation.protocol import Verdict
from ledger.states import CaseReason

MAX_TEXT = 10_000

# What each subject's runbooks are named by: every case reason, every reconciler verdict.
NAMES: dict[str, tuple[str, ...]] = {
    RunbookSubject.REASON: tuple(CaseReason.values),
    RunbookSubject.VERDICT: tuple(v.value for v in Verdict),
}

_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
_TAGS = {
    "p", "br", "hr", "strong", "em", "code", "pre", "blockquote", "ul", "ol", "li", "a",
    "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "th": {"align"}, "td": {"align"}}
_SCHEMES = {"http", "https", "mailto"}


def runbook_html(text: str) -> str:
    """The sanitised HTML of a runbook's Markdown (safe to mark safe in a template)."""
    rendered = _MARKDOWN.render(text)
    return nh3.clean(
        rendered, tags=_TAGS, attributes=_ATTRIBUTES, url_schemes=_SCHEMES, link_rel="noopener noreferrer nofollow"
    )


def _checked(subject: object, name: object, text: object) -> tuple[str, str, str]:
    if subject not in NAMES:
        raise InvalidInput(f"a runbook is for one of: {', '.join(NAMES)}", field="subject")
    names = NAMES[str(subject)]
    if name not in names:
        raise InvalidInput(f"a {subject} runbook is named by one of: {', '.join(names)}", field="name")
    if not isinstance(text, str):
        raise InvalidInput("a runbook's text is Markdown", field="text")
    text = text.replace("\r\n", "\n").strip()
    if len(text) > MAX_TEXT:
        raise InvalidInput(f"a runbook is at most {MAX_TEXT:,} characters", field="text")
    check_text(text, path="text")  # it is stored and shown to every person on the tenant
    return str(subject), str(name), text


@transaction.atomic
def runbook_set(
    *, tenant: Tenant, subject: str, name: str, text: str, reason: str, user: Any = None, set_by: str = ""
) -> Runbook | None:
    """Write (or, with an empty text, remove) the tenant's runbook for ``subject``/``name``.
    A console ``user`` must be an admin of the tenant (checked here); a command names
    ``set_by``. Returns the runbook, or None when it was removed."""
    subject, name, text = _checked(subject, name, text)
    acting = acting_name(user=user, name=set_by, tenant_id=tenant.pk, perm=ADMINISTER)
    if not acting:
        raise InvalidInput("a runbook change names who made it")
    actor = user_actor(acting)
    reason = decision_reason(reason)
    if not text:
        Runbook.objects.filter(tenant=tenant, subject=subject, name=name).delete()
        row = None
        action = "runbook.remove"
    else:
        row, _ = Runbook.objects.update_or_create(
            tenant=tenant,
            subject=subject,
            name=name,
            defaults={"text": text, "updated_at": timezone.now(), "updated_by": actor},
        )
        action = "runbook.set"
    admin_action_record(
        tenant=tenant,
        actor=actor,
        action=action,
        subject=f"runbook for {subject} {name}",
        reason=reason,
        fields={"subject": subject, "name": name, "length": len(text)},
    )
    return row
