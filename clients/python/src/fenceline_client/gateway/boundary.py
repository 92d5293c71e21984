"""The result side of the secret boundary: a tool result is read before it reaches the model,
and every secret-looking value in its text is replaced by ``[redacted:<kind>]``.

The detector is detect-secrets (Yelp's, maintained): its regex plugins for known credential
formats (GitHub, GitLab, AWS, Slack, Stripe, OpenAI, JWT, npm, PyPI, SendGrid, Twilio, basic-auth
URLs, ...; the public-IP one is left out), the same library the server's boundary builds on
(``ledger/boundary/rules.py``), which is server-only and not imported here. Two rules of our
own where a plugin finds less than the whole secret: a PEM private key block (detect-secrets
flags its first line only) and ``Bearer <token>``.

The arguments side: the intent carries only the arguments' digest, so the gateway checks the
arguments itself with the same rules (``find_secret``) and refuses the call before anything is
sent (FORBIDDEN_FIELD); what it does send from them (``action``, ``resource``) is checked again
by the server's boundary (422 FORBIDDEN_FIELD).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import RegexBasedDetector

LEFT_OUT = {"Public IP (ipv4)"}  # an address is not a credential
OWN_RULES = (
    ("private_key", re.compile(r"-----BEGIN[A-Z ]*PRIVATE KEY-----.*?(?:-----END[A-Z ]*PRIVATE KEY-----|\Z)", re.S)),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{8,}=*")),
)


def _kind(secret_type: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", secret_type.lower()).strip("_")


@cache
def rules() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(kind, pattern) for every rule, our own first (they take whole blocks)."""
    found: list[tuple[str, re.Pattern[str]]] = list(OWN_RULES)
    plugins: dict[str, type[Any]] = get_mapping_from_secret_type_to_class()
    for secret_type, plugin in sorted(plugins.items()):
        if secret_type in LEFT_OUT or not issubclass(plugin, RegexBasedDetector):
            continue
        found.extend((_kind(secret_type), _whole(pattern)) for pattern in plugin().denylist)
    return tuple(found)


def _whole(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """The pattern taking the rest of the token it matched the start of (a plugin's GitHub
    pattern matches the first 36 characters of a longer token)."""
    try:
        return re.compile(f"(?:{pattern.pattern})[A-Za-z0-9_\\-]*", pattern.flags)
    except re.error:  # a pattern with global inline flags: taken as it is
        return pattern


@dataclass
class Redaction:
    """What was replaced in one result: counts by kind, never the values."""

    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def count(self) -> int:
        return sum(self.kinds.values())


def redact_text(text: str, redaction: Redaction) -> str:
    """``text`` with every match of a rule replaced by ``[redacted:<kind>]``, counted in ``redaction``."""
    for kind, pattern in rules():

        def replace(match: re.Match[str], kind: str = kind) -> str:
            redaction.kinds[kind] += 1
            return f"[redacted:{kind}]"

        text = pattern.sub(replace, text)
    return text


def redact_value(value: Any, redaction: Redaction) -> Any:
    """A JSON value (``structuredContent``) with every string redacted, keys included."""
    if isinstance(value, str):
        return redact_text(value, redaction)
    if isinstance(value, list):
        return [redact_value(item, redaction) for item in value]
    if isinstance(value, dict):
        return {redact_text(str(k), redaction): redact_value(v, redaction) for k, v in value.items()}
    return value


def find_secret(value: Any, path: str = "arguments") -> tuple[str, str] | None:
    """(path, kind) of the first secret-looking string in a JSON value (keys included), or None:
    the argument side, checked before the intent so that nothing of such a call leaves."""
    if isinstance(value, str):
        for kind, pattern in rules():
            if pattern.search(value):
                return path, kind
        return None
    if isinstance(value, list):
        items: Any = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, item in items:
        found = find_secret(str(key), path) if isinstance(key, str) else None
        found = found or find_secret(item, f"{path}.{key}")
        if found:
            return found
    return None
