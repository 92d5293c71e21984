"""Providers' signed delivery webhooks (``POST /api/v1/webhooks/deliveries/<source>``), fed
into the same record as the worker's reports (``ledger.services.delivery.record``).

A source (``settings.FENCELINE["DELIVERY_SOURCES"]``, docs/operations.md) names its style,
its secret by reference (``env:NAME`` or ``file:PATH``, resolved for each request and never
kept, logged or put in an answer), its tenant and how its payload maps to a delivery report:

* ``stripe``: ``Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``
  (several v1 may be given; one must match), refused outside ``tolerance_s`` (300) of now;
* ``github``: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>``; GitHub-style
  requests carry no timestamp, so a replay is answered by ``provider_event_id`` (recorded once).

Every comparison is ``hmac.compare_digest``. The signature is checked before the body is
parsed: a bad one is 401 BAD_SIGNATURE and nothing is read or written.
"""

import hashlib
import hmac
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from ledger.actors import provider_actor
from ledger.errors import BadSignature, InvalidInput, MalformedJSON, NotFound
from ledger.models import EffectDelivery, Operation, Tenant
from ledger.services.delivery.record import (
    Recorded,
    delivery_record_from_provider,
    occurred_at_parsed,
    report_checked,
)

DEFAULT_PATHS = {
    "message_id": "message_id",
    "operation_key": "operation_key",
    "status": "status",
    "provider_event_id": "provider_event_id",
    "occurred_at": "occurred_at",
}


def source_config(source: str) -> dict[str, Any]:
    sources: dict[str, dict[str, Any]] = settings.FENCELINE["DELIVERY_SOURCES"]
    config = sources.get(source)
    if config is None:
        raise NotFound("no delivery source of that name is configured")
    return config


def secret_resolved(reference: str) -> bytes:
    """The secret a reference names, read now: ``env:NAME`` or ``file:PATH``. A secret that
    cannot be read refuses the request as unsigned (nothing says which part failed)."""
    scheme, _, location = reference.partition(":")
    value: str | None = None
    if scheme == "env":
        value = os.environ.get(location)
    elif scheme == "file":
        try:
            value = Path(location).read_text().strip()
        except OSError:
            value = None
    if not value:
        raise BadSignature("this source's secret is not available: nothing can be verified")
    return value.encode()


def signature_check(config: dict[str, Any], headers: Mapping[str, str], body: bytes, *, now: float) -> None:
    """Refuse (401 BAD_SIGNATURE) unless the request is signed under the source's secret."""
    secret = secret_resolved(config["secret"])
    if config["style"] == "stripe":
        _stripe_check(secret, headers.get("Stripe-Signature", ""), body, now=now, tolerance_s=config["tolerance_s"])
    else:
        _github_check(secret, headers.get("X-Hub-Signature-256", ""), body)


def _stripe_check(secret: bytes, header: str, body: bytes, *, now: float, tolerance_s: int) -> None:
    parts = [item.partition("=") for item in header.split(",")]
    stamps = [value for key, _, value in parts if key.strip() == "t"]
    signatures = [value.strip() for key, _, value in parts if key.strip() == "v1"]
    if len(stamps) != 1 or not _ascii_digits(stamps[0].strip()) or not all(map(_hex, signatures)) or not signatures:
        raise BadSignature("Stripe-Signature must be t=<unix seconds>,v1=<hex HMAC-SHA256>")
    stamp = stamps[0].strip()
    if abs(now - int(stamp)) > tolerance_s:
        raise BadSignature(f"the signature's timestamp is more than {tolerance_s} s from now (a replay?)")
    expected = hmac.new(secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, given) for given in signatures):
        raise BadSignature("the signature does not match the body under this source's secret")


def _github_check(secret: bytes, header: str, body: bytes) -> None:
    scheme, _, given = header.partition("=")
    if scheme != "sha256" or not _hex(given.strip()):
        raise BadSignature("X-Hub-Signature-256 must be sha256=<hex HMAC-SHA256>")
    expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given.strip()):
        raise BadSignature("the signature does not match the body under this source's secret")


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _hex(text: str) -> bool:
    """A signature as sent: hex digits only (compare_digest refuses non-ASCII text)."""
    return bool(text) and text.isascii() and all(c in "0123456789abcdefABCDEF" for c in text)


def delivery_webhook_receive(*, source: str, headers: Mapping[str, str], body: bytes) -> Recorded:
    """Verify, parse, map and record one provider webhook."""
    config = source_config(source)
    signature_check(config, headers, body, now=time.time())
    try:
        payload = json.loads(body)
    except ValueError:
        raise MalformedJSON("the request body must be a JSON object") from None
    if not isinstance(payload, dict):
        raise MalformedJSON("the request body must be a JSON object")
    mapping: dict[str, Any] = config["map"]
    fields = {name: _pick(payload, headers, mapping.get(name, path)) for name, path in DEFAULT_PATHS.items()}
    raw_status = fields["status"]
    statuses: dict[str, str] = mapping.get("statuses", {})
    status = statuses.get(raw_status, raw_status.upper() if isinstance(raw_status, str) else raw_status)
    report = report_checked(
        state=status,
        message_id=fields["message_id"] if fields["message_id"] is not None else "",
        provider_event_id=fields["provider_event_id"],
        occurred_at=occurred_at_parsed(fields["occurred_at"]),
    )
    tenant = Tenant.objects.filter(slug=config["tenant"]).first()
    if tenant is None:
        raise NotFound("this source's tenant does not exist")
    by = mapping.get("by", "message_id")
    operation_id = _operation_for(tenant, by=by, value=fields[by])
    return delivery_record_from_provider(
        tenant=tenant, operation_id=operation_id, actor=provider_actor(source), report=report
    )


def _pick(payload: dict[str, Any], headers: Mapping[str, str], path: str) -> Any:
    """The value at a dotted ``path`` of the payload, or of a request header (``header:Name``)."""
    if path.startswith("header:"):
        return headers.get(path.removeprefix("header:"))
    value: Any = payload
    for step in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value


def _operation_for(tenant: Tenant, *, by: str, value: object) -> object:
    """The operation a webhook names: by its idempotency key, or by message id — a delivery
    already recorded under it, else the provider request id its outcome reported."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"the payload names no {by}", field=by)
    if by == "operation_key":
        found = Operation.objects.filter(tenant=tenant, idempotency_key=value).values_list("pk", flat=True).first()
    else:
        found = (
            EffectDelivery.objects.filter(tenant=tenant, message_id=value)
            .values_list("operation_id", flat=True)
            .first()
        ) or Operation.objects.filter(tenant=tenant, provider_request_id=value).values_list("pk", flat=True).first()
    if found is None:
        raise NotFound(f"no operation of this source's tenant has that {by}")
    return found
