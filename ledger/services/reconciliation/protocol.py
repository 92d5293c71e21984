"""What a reconciler is: ``lookup(operation)`` asks the provider whether an UNKNOWN effect
happened, by the operation's stable idempotency key or its provider request id, and
answers one of four verdicts with the evidence it saw.

    HAPPENED        the provider has the effect: its request id (and cost) is the evidence
    DID_NOT_HAPPEN  the provider says it never made it
    PENDING         the provider has it but has not finished: look again later
    CANNOT_TELL     the provider cannot say (lost record, unknown answer): a person decides

A provider that does not answer (timeout, connection refused, 5xx) is not a verdict: the
reconciler raises :class:`ProviderUnavailable` and the job backs off.

A lookup never carries secrets out: ``asked`` is the method and URL path with the lookup
value (the idempotency key or request id, which are identifiers, not credentials), and the
answer is kept as its status, the few fields read from it, and a SHA-256 digest of its body.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ledger.models import Operation


class Verdict(enum.StrEnum):
    HAPPENED = "HAPPENED"
    DID_NOT_HAPPEN = "DID_NOT_HAPPEN"
    PENDING = "PENDING"
    CANNOT_TELL = "CANNOT_TELL"


@dataclass(frozen=True)
class Lookup:
    """One answer of a provider, as evidence."""

    verdict: Verdict
    asked: str  # e.g. "GET /v1/charges?idempotency_key=op-17"
    status: int | None = None  # the provider's HTTP status, where there is one
    answer_digest: str = ""  # "sha256:" + hex of the answer's bytes
    provider_request_id: str = ""
    actual_cost_cents: int | None = None
    why: str = ""  # one line for people: what the answer said
    # What the answer showed, for the chain: the provider's ids and statuses (never a body,
    # a text or a header), e.g. {"object": "payment_intent", "id": "pi_3", "status": "succeeded"}.
    read: dict[str, Any] = field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        """The lookup as event fields and case history (allow-listed, no raw body)."""
        document: dict[str, Any] = {"verdict": self.verdict.value, "asked": self.asked, "why": self.why}
        if self.status is not None:
            document["status"] = self.status
        if self.answer_digest:
            document["answer_digest"] = self.answer_digest
        if self.provider_request_id:
            document["provider_request_id"] = self.provider_request_id
        if self.read:
            document["found"] = self.read
        return document


class ProviderUnavailable(Exception):
    """The provider did not answer: try again later. The message names what failed
    (timeout, refused, status 503), never a URL's query or a header. ``retry_after_s``: how
    long the provider asked to be left alone (a 429's Retry-After), when it said."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Reconciler(Protocol):
    name: str

    def lookup(self, operation: Operation, *, request_id: str = "", now: datetime | None = None) -> Lookup:
        """The provider's answer about ``operation`` (``request_id``: a provider request id
        from the case's unverified evidence, when the operation has none); raises
        ProviderUnavailable."""


def digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()
