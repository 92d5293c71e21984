"""Provider adapters: reconcilers that know one provider's API and how a worker tags its
effects there (``fenceline_client.provider_tags``): Stripe, GitHub, Slack, email over IMAP.
docs/providers.md shows both sides."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ledger.models import Operation
from ledger.services.reconciliation.credentials import CredentialRef, credential_ref
from ledger.services.reconciliation.protocol import Lookup, Verdict
from ledger.services.reconciliation.wire import Answer

_SHORT_CODE = re.compile(r"^[a-z0-9_.]{1,64}$")


def settings_of(name: str, config: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``config`` over ``defaults``; an unknown key or a missing ``auth`` is a config error."""
    unknown = set(config) - set(defaults) - {"kind"}
    if unknown:
        raise ImproperlyConfigured(f"reconciler {name!r}: unknown setting(s) {', '.join(sorted(unknown))}")
    merged = {**defaults, **config}
    for key, default in defaults.items():
        number = isinstance(default, int) and not isinstance(default, bool)
        if number and (type(merged[key]) not in (int, float) or merged[key] < 0):
            raise ImproperlyConfigured(f"reconciler {name!r}: {key} must be a number >= 0")
    return merged


def required_credential(name: str, config: dict[str, Any]) -> CredentialRef:
    credential = credential_ref(name, config.get("auth"))
    if credential is None:
        raise ImproperlyConfigured(f'reconciler {name!r}: auth is required ({{"type": ..., "secret": "env:NAME"}})')
    return credential


def json_of(answer: Answer) -> Any:
    """The answer's JSON document, or None when it is not JSON."""
    try:
        return json.loads(answer.body)
    except ValueError:
        return None


def seen(answer: Answer) -> dict[str, Any]:
    """What every lookup records of the answer: what was asked, the status, the digest."""
    return {"asked": answer.asked, "status": answer.status, "answer_digest": answer.digest}


def cannot_tell(answer: Answer, why: str, **read: Any) -> Lookup:
    return Lookup(Verdict.CANNOT_TELL, why=why, read=read, **seen(answer))


def short_code(value: object) -> str:
    """A provider's error code when it is a short token (``channel_not_found``), else ""."""
    return value if isinstance(value, str) and _SHORT_CODE.match(value) else ""


def since(operation: Operation, margin_s: float) -> datetime:
    """The earliest time the effect can carry: the intent, less a margin for clock skew."""
    return operation.created_at - timedelta(seconds=margin_s)
