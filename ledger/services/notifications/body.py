"""A notification's body: Slack-compatible ``{"text", "blocks", "fenceline": {...}}``, made
only from allow-listed, already-stored fields (ids, kinds, counts, tool names, stored
reasons), then judged by the secret boundary. A body the boundary refuses is never sent."""

from datetime import datetime
from typing import Any

from django.conf import settings

from ledger.boundary import check_fields
from ledger.errors import ForbiddenField

BODY_SCHEMA_VERSION = 1
MAX_TEXT = 600


def slack_escape(text: object) -> str:
    """Slack's mrkdwn escapes: ``<!channel>`` or ``<url|label>`` in a stored reason stays text."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")[:MAX_TEXT]


def console_url(path: str) -> str:
    return f"{settings.FENCELINE.get('CONSOLE_URL', '')}{path}"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def build_body(
    *, kind: str, tenant_slug: str, headline: str, subject: dict[str, Any], path: str, at: datetime
) -> dict[str, Any] | None:
    """The body, or None when the boundary refuses it (the caller records that, unsent)."""
    url = console_url(path)
    text = f"[{slack_escape(tenant_slug)}] {slack_escape(headline)}"
    body = {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{url}|Open in Fenceline>"}]},
        ],
        "fenceline": {
            "schema_version": BODY_SCHEMA_VERSION,
            "kind": kind,
            "tenant": tenant_slug,
            "subject": {key: (_iso(v) if isinstance(v, datetime) else v) for key, v in subject.items()},
            "console_url": url,
            "at": _iso(at),
        },
    }
    try:
        check_fields(body)
    except ForbiddenField:
        return None
    return body
