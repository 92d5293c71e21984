"""Email: a message found by the Message-ID Fenceline gives it, over IMAP.

The worker sends the message with ``Message-ID: message_id(key, domain)``
(``<fl.KEY@domain>``, ``fenceline_client.provider_tags``) and keeps a copy where the reconciler
can read it: a Bcc to an archive mailbox, or an IMAP APPEND to "Sent" (some providers, Gmail
among them, file sent mail themselves). The lookup logs in (``auth`` of type ``basic``, the
secret "user:password"), opens each of ``mailboxes`` read-only (EXAMINE) and asks

    UID SEARCH HEADER Message-ID "<fl.KEY@domain>"

then fetches the Message-ID of each hit and compares it whole (SEARCH HEADER matches a
substring). Found: HAPPENED, with the Message-ID as the provider's id and the mailbox and UID as
evidence; found only in one of ``pending_mailboxes`` (an outbox the sender drains): PENDING; in
no mailbox: DID_NOT_HAPPEN. A refused login or a missing mailbox: CANNOT_TELL. No
answer, or the server's ``[UNAVAILABLE]`` / ``[LIMIT]``: looked up again later.
"""

from __future__ import annotations

import imaplib
import ipaddress
import re
import ssl
from datetime import datetime
from email.parser import BytesHeaderParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from fenceline_client.provider_tags import message_id
from ledger.models import Operation
from ledger.services.reconciliation.protocol import Lookup, ProviderUnavailable, Verdict, digest
from ledger.services.reconciliation.providers import required_credential, settings_of

DEFAULTS: dict[str, Any] = {
    "host": None,
    "port": 993,
    "security": "tls",  # "tls" (IMAPS), "starttls", or "none" (a loopback host only)
    "mailboxes": ["Sent"],
    "pending_mailboxes": [],  # where a message waits to be sent (an outbox): found there, PENDING
    "domain": None,  # the Message-ID's domain, as the worker gives it to message_id()
    "auth": None,
    "timeout_s": 10,
}
MSG_ID = re.compile(r"<[^<>\s]+>")
TRANSIENT = (b"[UNAVAILABLE]", b"[LIMIT]", b"[INUSE]", b"[SERVERBUG]")


class _Refused(Exception):
    """The IMAP server said NO or BAD to something other than a transient condition."""


class EmailReconciler:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.config = settings_of(name, config, DEFAULTS)
        self.credential = required_credential(name, self.config)
        if self.credential.type != "basic":
            raise ImproperlyConfigured(f'reconciler {name!r}: auth.type must be "basic" (the secret "user:password")')
        host, security = self.config["host"], self.config["security"]
        if not isinstance(host, str) or not host:
            raise ImproperlyConfigured(f"reconciler {name!r}: host is required")
        if security not in ("tls", "starttls", "none"):
            raise ImproperlyConfigured(f'reconciler {name!r}: security must be "tls", "starttls" or "none"')
        if security == "none" and not _loopback(host):
            raise ImproperlyConfigured(f'reconciler {name!r}: security "none" is only for a loopback host')
        for key in ("mailboxes", "pending_mailboxes"):
            names = self.config[key]
            if not isinstance(names, list) or not all(isinstance(m, str) and m for m in names):
                raise ImproperlyConfigured(f"reconciler {name!r}: {key} must be a list of mailbox names")
        if not self.config["mailboxes"]:
            raise ImproperlyConfigured(f"reconciler {name!r}: mailboxes must name at least one mailbox")
        try:
            message_id("k", str(self.config["domain"]))
        except ValueError:
            raise ImproperlyConfigured(
                f"reconciler {name!r}: domain must be a host name such as mail.example.com"
            ) from None

    def lookup(self, operation: Operation, *, request_id: str = "", now: datetime | None = None) -> Lookup:
        wanted = message_id(operation.idempotency_key, self.config["domain"])
        searched = [*self.config["mailboxes"], *self.config["pending_mailboxes"]]
        asked = f"IMAP UID SEARCH HEADER Message-ID {wanted} in {', '.join(searched)}"
        try:
            with self._connect() as imap:
                try:
                    user, password = self.credential.login()
                    imap.login(user, password)
                except imaplib.IMAP4.error:
                    return Lookup(Verdict.CANNOT_TELL, asked=asked, why="the IMAP server refused the login")
                for mailbox in searched:
                    uid = _find(imap, mailbox, wanted)
                    if uid:
                        sent = mailbox in self.config["mailboxes"]
                        return Lookup(
                            Verdict.HAPPENED if sent else Verdict.PENDING,
                            asked=asked,
                            why=f"{wanted} is in {mailbox}" + ("" if sent else ", waiting to be sent"),
                            provider_request_id=wanted if sent else "",
                            read={"mailbox": mailbox, "uid": uid},
                            answer_digest=digest(wanted.encode()),
                        )
        except _Refused as exc:
            return Lookup(Verdict.CANNOT_TELL, asked=asked, why=str(exc))
        except (OSError, imaplib.IMAP4.abort) as exc:
            raise ProviderUnavailable(f"{self.name}: IMAP {type(exc).__name__}") from None
        return Lookup(Verdict.DID_NOT_HAPPEN, asked=asked, why=f"{wanted} is in no mailbox searched")

    def _connect(self) -> imaplib.IMAP4:
        host, port, timeout = self.config["host"], int(self.config["port"]), float(self.config["timeout_s"])
        if self.config["security"] == "tls":
            return imaplib.IMAP4_SSL(host, port, ssl_context=ssl.create_default_context(), timeout=timeout)
        imap = imaplib.IMAP4(host, port, timeout=timeout)
        if self.config["security"] == "starttls":
            imap.starttls(ssl.create_default_context())
        return imap


def _find(imap: imaplib.IMAP4, mailbox: str, wanted: str) -> str:
    """The UID of the message whose Message-ID is ``wanted`` in ``mailbox``, or ""."""
    status, data = imap.select(_quoted(mailbox), readonly=True)
    _check(status, data, f"the IMAP server has no mailbox {mailbox}")
    status, data = imap.uid("SEARCH", "HEADER", "Message-ID", _quoted(wanted))
    _check(status, data, "the IMAP server refused the search")
    uids = (data[0] or b"").split() if data and isinstance(data[0], bytes) else []
    for uid in uids[:50]:
        status, fetched = imap.uid("FETCH", uid.decode(), "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
        _check(status, fetched, "the IMAP server refused the fetch")
        for part in fetched:
            if (
                isinstance(part, tuple)
                and BytesHeaderParser().parsebytes(part[1]).get("Message-ID", "").strip() == wanted
            ):
                return uid.decode()
    return ""


def _check(status: str, data: list[Any], why: str) -> None:
    if status == "OK":
        return
    text = b" ".join(d for d in data if isinstance(d, bytes))
    if any(code in text for code in TRANSIENT):
        raise imaplib.IMAP4.abort("transient")
    raise _Refused(why)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
