"""Where a webhook goes and how it is signed, without storing a secret (invariant 6).

* A target is an https URL that passes the secret boundary, at a public address
  (``addresses.py``: a host the operator allows by name may be anything, http included), or
  ``ref:<name>``: a URL kept in ``settings.FENCELINE["WEBHOOK_TARGETS"]`` because it carries
  its secret in the path (a Slack webhook), resolved only when a delivery is sent.
* An endpoint's signing secret is ``whsec_`` + hex HMAC-SHA256(WEBHOOK_KEYS[key_id],
  "<endpoint id>:<key_version>"): derived when it is shown or used, never stored.
* A request's signature is ``t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``.
"""

import hashlib
import hmac
import re
from urllib.parse import urlsplit

from django.conf import settings

from ledger.boundary import credential_kind
from ledger.errors import InvalidInput
from ledger.services.notifications.addresses import AddressRefused, host_allowed, host_check

REF_PREFIX = "ref:"
MAX_TARGET_LENGTH = 500
_REF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def url_parts(url: str) -> tuple[str, str, int] | None:
    """Scheme, host and port of an absolute http(s) URL without user info or fragment, or None."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    except ValueError:
        return None
    if not hostname or parts.username is not None or parts.password is not None or parts.fragment:
        return None
    return (parts.scheme, hostname, port) if parts.scheme in _DEFAULT_PORTS else None


def target_check(target: object) -> str:
    """The target to store, or InvalidInput naming the field ``target`` (never its value)."""
    if not isinstance(target, str) or not target.strip():
        raise InvalidInput("a webhook names its target: an https URL or ref:<name>", field="target")
    target = target.strip()
    if len(target) > MAX_TARGET_LENGTH:
        raise InvalidInput(f"the target is at most {MAX_TARGET_LENGTH} characters", field="target")
    if target.startswith(REF_PREFIX):
        name = target.removeprefix(REF_PREFIX)
        if not _REF_NAME.fullmatch(name):
            raise InvalidInput("a target reference is ref:<name> with letters, digits, . _ -", field="target")
        if name not in settings.FENCELINE["WEBHOOK_TARGETS"]:
            raise InvalidInput("that target reference is not configured (FENCELINE_WEBHOOK_TARGETS)", field="target")
        return target
    if credential_kind(target, remember=False) is not None:
        raise InvalidInput(
            "the URL carries a credential: keep it in FENCELINE_WEBHOOK_TARGETS and name it ref:<name>",
            field="target",
        )
    where = url_parts(target)
    if where is None or (where[0] == "http" and not host_allowed(*where[1:])):
        raise InvalidInput(
            "the target is an https URL without user info (http only to a host in FENCELINE_WEBHOOK_ALLOWED_HOSTS)",
            field="target",
        )
    try:
        host_check(*where)
    except AddressRefused:
        raise InvalidInput(
            "the target's host is not a public address (loopback, private, link-local, multicast or reserved); "
            "an operator may allow a host by name in FENCELINE_WEBHOOK_ALLOWED_HOSTS",
            field="target",
        ) from None
    return target


def target_url(target: str) -> str | None:
    """The URL to send to (a reference resolved now), or None when it cannot be used."""
    if target.startswith(REF_PREFIX):
        url = settings.FENCELINE["WEBHOOK_TARGETS"].get(target.removeprefix(REF_PREFIX))
    else:
        url = target
    return url if isinstance(url, str) and url_parts(url) is not None else None


def target_label(target: str) -> str:
    """What the console shows of a target: a reference by name, a URL by scheme and host."""
    if target.startswith(REF_PREFIX):
        return target
    parts = urlsplit(target)
    return f"{parts.scheme}://{parts.netloc}/…" if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/"


class SigningKeyMissing(Exception):
    """The endpoint's key id is no longer among FENCELINE_WEBHOOK_KEYS."""


def signing_secret(*, endpoint_id: object, key_id: str, key_version: int) -> str:
    key = settings.FENCELINE["WEBHOOK_KEYS"].get(key_id)
    if key is None:
        raise SigningKeyMissing
    return "whsec_" + hmac.new(key, f"{endpoint_id}:{key_version}".encode(), hashlib.sha256).hexdigest()


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The ``Fenceline-Signature`` header of ``body`` sent at ``timestamp`` (unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"
