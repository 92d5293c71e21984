"""How a worker tags an effect at its provider, so that Fenceline's provider reconcilers can
find it by the operation's idempotency key when the outcome is UNKNOWN (docs/providers.md).
The reconcilers build the same tags from these functions: one spelling on both sides.

    Stripe   a PaymentIntent's metadata         stripe_metadata(key)     {"fenceline_key": key}
    GitHub   a hidden marker in a comment       github_marker(key)       "<!-- fenceline:KEY -->"
    Slack    a message's metadata               slack_metadata(key)      {"event_type": ..., "event_payload": ...}
    email    the Message-ID header              message_id(key, domain)  "<fl.KEY@domain>"

No Django, no network: plain functions of the key.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

STRIPE_METADATA_KEY = "fenceline_key"
SLACK_EVENT_TYPE = "fenceline_effect"
SLACK_PAYLOAD_KEY = "fenceline_key"
_MARKER_PREFIX = "<!-- fenceline:"
_ATEXT_SAFE = re.compile(r"[A-Za-z0-9_-]")
_DOMAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$")


def stripe_metadata(key: str) -> dict[str, str]:
    """The metadata to give the PaymentIntent (Stripe allows 500 characters a value)."""
    return {STRIPE_METADATA_KEY: _checked(key)}


def github_marker(key: str) -> str:
    """A hidden HTML comment to put in the comment's body (GitHub does not render it). The key
    is percent-encoded, so no key can close the comment early."""
    return f"{_MARKER_PREFIX}{quote(_checked(key), safe='')} -->"


def slack_metadata(key: str, event_type: str = SLACK_EVENT_TYPE) -> dict[str, Any]:
    """The ``metadata`` argument of ``chat.postMessage``."""
    return {"event_type": event_type, "event_payload": {SLACK_PAYLOAD_KEY: _checked(key)}}


def message_id(key: str, domain: str) -> str:
    """The Message-ID header of an email sent for the operation with this key: ``<fl.KEY@domain>``,
    where every character of the key outside ``A-Z a-z 0-9 _ -`` is written ``=XX`` (its
    UTF-8 bytes in hex), so the id is a valid RFC 5322 msg-id whatever the key."""
    if not _DOMAIN.match(domain):
        raise ValueError("domain must be a host name such as mail.example.com")
    left = "".join(c if _ATEXT_SAFE.match(c) else "".join(f"={b:02X}" for b in c.encode()) for c in _checked(key))
    return f"<fl.{left}@{domain.lower()}>"


def _checked(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError("the idempotency key must be a non-empty string")
    return key
