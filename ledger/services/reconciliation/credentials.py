"""A reconciler's credential, named by reference and resolved at call time (docs/providers.md):

    "auth": {"type": "bearer", "secret": "env:STRIPE_KEY"}                 Authorization: Bearer <secret>
                                                    (an environment variable's name: A-Z, 0-9, _)
    "auth": {"type": "basic", "secret": "file:/run/secrets/imap"}          Authorization: Basic <b64(secret)>
                                                                           (the secret is "user:password")
    "auth": {"type": "header", "name": "X-Api-Key", "secret": "env:KEY"}   X-Api-Key: <secret>

The value is read from the environment variable or the file (trailing newline stripped) each
time a lookup asks, and lives only in the request's headers: never in a setting, an attribute,
an event, a case, a log line or an exception message. Errors name the reconciler and the
reference (``env:STRIPE_KEY``), never the value.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ledger.boundary import credential_kind
from ledger.services.reconciliation.protocol import ProviderUnavailable

TYPES = ("bearer", "basic", "header")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_FORBIDDEN_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "cookie"}


@dataclass(frozen=True)
class CredentialRef:
    """Where a reconciler's secret is kept, and how it is sent. Holds no secret."""

    reconciler: str
    type: str
    reference: str  # "env:NAME" or "file:PATH"
    header_name: str = "Authorization"

    def problem(self) -> str:
        """Why the reference cannot be resolved now ("" when it can): for the config check."""
        try:
            self._read()
        except ProviderUnavailable as exc:
            return str(exc)
        return ""

    def headers(self) -> dict[str, str]:
        """The header to send, resolved now (raises ProviderUnavailable when it cannot be)."""
        secret = self._read()
        if self.type == "bearer":
            return {"Authorization": f"Bearer {secret}"}
        if self.type == "basic":
            return {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode("ascii")}
        return {self.header_name: secret}

    def login(self) -> tuple[str, str]:
        """(user, password) of a ``basic`` secret "user:password", resolved now (IMAP)."""
        user, sep, password = self._read().partition(":")
        if self.type != "basic" or not sep or not user:
            raise ProviderUnavailable(
                f"reconciler {self.reconciler!r}: credential {self.reference} is not a basic user:password"
            )
        return user, password

    def _read(self) -> str:
        kind, _, where = self.reference.partition(":")
        value: str | None
        if kind == "env":
            value = os.environ.get(where)
        else:
            try:
                value = Path(where).read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise ProviderUnavailable(
                    f"reconciler {self.reconciler!r}: credential {self.reference} cannot be read ({type(exc).__name__})"
                ) from None
        if not value:
            raise ProviderUnavailable(
                f"reconciler {self.reconciler!r}: credential {self.reference} is not set or empty"
            )
        if any(c in value for c in "\r\n\0"):
            raise ProviderUnavailable(f"reconciler {self.reconciler!r}: credential {self.reference} holds a line break")
        return value


def credential_ref(reconciler: str, auth: Any) -> CredentialRef | None:
    """The ``auth`` setting of ``reconciler`` checked (None: no authentication)."""
    if auth is None:
        return None
    where = f"reconciler {reconciler!r}: auth"
    if not isinstance(auth, dict):
        raise ImproperlyConfigured(f'{where} must be {{"type": ..., "secret": "env:NAME" | "file:PATH"}}')
    unknown = set(auth) - {"type", "name", "secret"}
    if unknown:
        raise ImproperlyConfigured(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    kind = auth.get("type")
    if kind not in TYPES:
        raise ImproperlyConfigured(f"{where}.type must be one of {', '.join(TYPES)}")
    reference = auth.get("secret")
    if not isinstance(reference, str) or not _valid_reference(reference):
        # The value itself is never echoed: it may be a secret pasted where a reference belongs.
        raise ImproperlyConfigured(f'{where}.secret must be a reference "env:NAME" or "file:/absolute/path"')
    name = auth.get("name")
    if kind == "header":
        if not isinstance(name, str) or not _HEADER_NAME.match(name) or name.lower() in _FORBIDDEN_HEADERS:
            raise ImproperlyConfigured(f"{where}.name must be a header name such as X-Api-Key")
        return CredentialRef(reconciler, kind, reference, name)
    if name is not None:
        raise ImproperlyConfigured(f'{where}.name is only for type "header"')
    return CredentialRef(reconciler, kind, reference)


def _valid_reference(reference: str) -> bool:
    kind, sep, where = reference.partition(":")
    if not sep or credential_kind(reference, remember=False) is not None:
        return False  # a value that reads as a credential is not taken for a reference
    if kind == "env":
        return bool(_ENV_NAME.match(where))
    return kind == "file" and where.startswith("/") and "\0" not in where
