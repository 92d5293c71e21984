"""Where a webhook goes and how it is signed, without storing a secret (invariant 6).

* A target is an https URL that passes the secret boundary (http only to this machine), or
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

REF_PREFIX = "ref:"
MAX_TARGET_LENGTH = 500
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_REF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _url_allowed(url: str) -> bool:
    """An absolute https URL (http to this machine only), without user info or fragment."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
        parts.port  # noqa: B018 - a malformed port raises here
    except ValueError:
        return False
    if not hostname or parts.username is not None or parts.password is not None or parts.fragment:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and hostname in LOCAL_HOSTS)


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
    if not _url_allowed(target):
        raise InvalidInput(
            "the target is an https URL without user info (http only to 127.0.0.1 or localhost)", field="target"
        )
    return target


def target_url(target: str) -> str | None:
    """The URL to send to (a reference resolved now), or None when it cannot be used."""
    if target.startswith(REF_PREFIX):
        url = settings.FENCELINE["WEBHOOK_TARGETS"].get(target.removeprefix(REF_PREFIX))
    else:
        url = target
    return url if isinstance(url, str) and _url_allowed(url) else None


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
