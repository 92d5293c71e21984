"""Stripe: a PaymentIntent found by the operation's idempotency key in its metadata.

The worker creates the PaymentIntent with ``metadata=stripe_metadata(key)``
(``{"fenceline_key": key}``, ``fenceline_client.provider_tags``). The lookup asks the Search API

    GET /v1/payment_intents/search?query=metadata['fenceline_key']:'KEY'&limit=100[&page=...]

(``has_more`` / ``next_page`` paginate) and reads the status of what it finds. When a
PaymentIntent id is known (the operation's provider request id, or one a fenced worker reported
late), ``GET /v1/payment_intents/{id}`` is read first — it has no search lag — and must carry
the key (else CANNOT_TELL); an id Stripe does not know falls back to the search.

    succeeded, requires_capture                      HAPPENED (the money moved or is held)
    processing, requires_action, requires_confirmation   PENDING (look again later)
    canceled, requires_payment_method                DID_NOT_HAPPEN (no money moved)
    nothing found                                    DID_NOT_HAPPEN, once Stripe's search index has
                                                     had ``search_lag_s`` (60 s) since the intent:
                                                     before that, looked up again later
    two PaymentIntents went through, another status  CANNOT_TELL (a person looks)

The lists are settings (``happened``, ``pending``, ``did_not_happen``). Evidence: the ids and
statuses found (``pi_...``), the amount and currency of the one that went through.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.utils import timezone

from fenceline_client.provider_tags import STRIPE_METADATA_KEY
from ledger.models import Operation
from ledger.services.reconciliation.protocol import Lookup, ProviderUnavailable, Verdict
from ledger.services.reconciliation.providers import (
    cannot_tell,
    json_of,
    required_credential,
    seen,
    settings_of,
    short_code,
)
from ledger.services.reconciliation.wire import WIRE_DEFAULTS, Answer, Wire
from ledger.services.upgrades import provider_ref

DEFAULTS: dict[str, Any] = {
    "base_url": "https://api.stripe.com",
    "auth": None,
    "api_version": None,  # sent as Stripe-Version when set
    "metadata_key": STRIPE_METADATA_KEY,
    "happened": ["succeeded", "requires_capture"],
    "pending": ["processing", "requires_action", "requires_confirmation"],
    "did_not_happen": ["canceled", "requires_payment_method"],
    "search_lag_s": 60,
    "max_pages": 5,
    **WIRE_DEFAULTS,
}
SEARCH = "/v1/payment_intents/search"
PAYMENT_INTENT_ID = re.compile(r"^pi_[A-Za-z0-9]{1,200}$")


class StripeReconciler:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.config = settings_of(name, config, DEFAULTS)
        headers = {"Stripe-Version": self.config["api_version"]} if self.config["api_version"] else {}
        self.wire = Wire(
            name,
            self.config["base_url"],
            credential=required_credential(name, self.config),
            options=self.config,
            headers=headers,
        )

    def lookup(self, operation: Operation, *, request_id: str = "", now: datetime | None = None) -> Lookup:
        known = provider_ref.reference(operation, provider_ref.phase_now())
        request_id = (known.id if known is not None else "") or request_id
        if PAYMENT_INTENT_ID.match(request_id):
            by_id = self._by_id(operation, request_id)
            if by_id is not None:
                return by_id
        return self._search(operation, now)

    def _by_id(self, operation: Operation, intent_id: str) -> Lookup | None:
        """The PaymentIntent a fenced worker reported, read directly (no search lag); None
        when Stripe has no such id (then the search decides)."""
        answer = self.wire.get(f"/v1/payment_intents/{intent_id}")
        document = json_of(answer)
        if answer.status == 404:
            return None
        if answer.status != 200 or not isinstance(document, dict):
            return cannot_tell(answer, f"Stripe answered status {answer.status}")
        if not _carries(document, self.config, operation.idempotency_key):
            return cannot_tell(answer, f"PaymentIntent {intent_id} does not carry the operation's key")
        return self._verdict(operation, [document], answer, timezone.now())

    def _search(self, operation: Operation, now: datetime | None) -> Lookup:
        key = operation.idempotency_key
        escaped = key.replace("\\", "\\\\").replace("'", "\\'")
        params: dict[str, str | int] = {"query": f"metadata['{self.config['metadata_key']}']:'{escaped}'", "limit": 100}
        found: list[dict[str, Any]] = []
        first: Answer | None = None
        for _page in range(int(self.config["max_pages"])):
            answer = self.wire.get(SEARCH, params)
            first = first or answer
            document = json_of(answer)
            if answer.status != 200 or not isinstance(document, dict) or not isinstance(document.get("data"), list):
                error = document.get("error") if isinstance(document, dict) else None
                code = short_code(error.get("code") or error.get("type")) if isinstance(error, dict) else ""
                return cannot_tell(
                    answer, f"Stripe answered status {answer.status}", **({"error_code": code} if code else {})
                )
            found += [pi for pi in document["data"] if isinstance(pi, dict) and _carries(pi, self.config, key)]
            if not document.get("has_more") or not isinstance(document.get("next_page"), str):
                break
            params = {**params, "page": document["next_page"]}
        else:
            return cannot_tell(first or answer, f"more than {self.config['max_pages']} pages of results")
        return self._verdict(operation, found, first or answer, now or timezone.now())

    def _verdict(self, operation: Operation, found: list[dict[str, Any]], answer: Answer, now: datetime) -> Lookup:
        config = self.config
        if not found:
            waited = (now - operation.created_at).total_seconds()
            if waited < config["search_lag_s"]:
                raise ProviderUnavailable(
                    f"{self.name}: Stripe's search may not show a new PaymentIntent yet",
                    retry_after_s=config["search_lag_s"] - waited,
                )
            return Lookup(Verdict.DID_NOT_HAPPEN, why="no PaymentIntent carries the key", **seen(answer))
        intents = [{"id": str(pi.get("id", ""))[:100], "status": short_code(pi.get("status"))} for pi in found]
        went_through = [pi for pi in found if pi.get("status") in config["happened"]]
        read: dict[str, Any] = {"payment_intents": intents}
        if len(went_through) > 1:
            return cannot_tell(answer, f"{len(went_through)} PaymentIntents carry the key and went through", **read)
        if went_through:
            (pi,) = went_through
            read.update(amount=pi.get("amount"), currency=short_code(pi.get("currency")))
            rid = intents[found.index(pi)]["id"]
            why = f"PaymentIntent {rid} is {pi.get('status')}"
            return Lookup(Verdict.HAPPENED, why=why, provider_request_id=rid, read=read, **seen(answer))
        if any(pi.get("status") in config["pending"] for pi in found):
            return Lookup(Verdict.PENDING, why="a PaymentIntent with the key is in progress", read=read, **seen(answer))
        if all(pi.get("status") in config["did_not_happen"] for pi in found):
            return Lookup(
                Verdict.DID_NOT_HAPPEN, why="no PaymentIntent with the key moved money", read=read, **seen(answer)
            )
        return cannot_tell(answer, "a PaymentIntent with the key has a status in none of the lists", **read)


def _carries(intent: dict[str, Any], config: dict[str, Any], key: str) -> bool:
    metadata = intent.get("metadata")
    return isinstance(metadata, dict) and metadata.get(config["metadata_key"]) == key
