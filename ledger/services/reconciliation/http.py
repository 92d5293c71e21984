"""The HTTP reconciler: looks an operation up at a provider's HTTP API, as configured per
provider in ``settings.FENCELINE["RECONCILERS"]`` (docs/operations.md):

    "sandbox-payments": {
      "kind": "http",
      "base_url": "http://127.0.0.1:8766",
      "by_request_id": "/v1/charges/{provider_request_id}",           # tried first, when known
      "by_idempotency_key": "/v1/charges?idempotency_key={idempotency_key}",
      "id_field": "id",                 # the provider's request id in the answer (dotted path)
      "status_field": "status",         # null: a record found is HAPPENED
      "happened": ["succeeded"], "pending": ["pending"], "did_not_happen": ["failed", "canceled"],
      "cost_field": "amount_cents",     # null: the cost is not read
      "not_found_status": [404],        # the provider has no such record
      "key_retention_s": 86400,         # idempotency keys older than this are forgotten by the
                                        # provider: a "not found" by key is then CANNOT_TELL
      "timeout_s": 5,
      "auth": {"type": "bearer", "secret": "env:SANDBOX_KEY"}   # optional (credentials.py)
    }

How an answer reads: 5xx, a timeout or a refused connection → ProviderUnavailable (the
job backs off); 429 → asked again after its Retry-After, within bounds, else likewise
(``wire.py``); a not-found status → DID_NOT_HAPPEN (by key, within the key's retention);
200 with a record → its status field decides; anything else (another status, a body that is
not JSON, a status value in none of the lists) → CANNOT_TELL, for a person.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from ledger.models import Operation
from ledger.services.reconciliation.credentials import credential_ref
from ledger.services.reconciliation.protocol import Lookup, Verdict
from ledger.services.reconciliation.wire import WIRE_DEFAULTS, Wire
from ledger.services.upgrades import provider_ref

DEFAULTS: dict[str, Any] = {
    "by_request_id": None,
    "by_idempotency_key": None,
    "id_field": "id",
    "status_field": None,
    "happened": [],
    "pending": [],
    "did_not_happen": [],
    "cost_field": None,
    "not_found_status": [404],
    "key_retention_s": None,
    **WIRE_DEFAULTS,
    "auth": None,
}


class HttpReconciler:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        unknown = set(config) - set(DEFAULTS) - {"kind", "base_url"}
        if unknown:
            raise ImproperlyConfigured(f"reconciler {name!r}: unknown setting(s) {', '.join(sorted(unknown))}")
        self.name = name
        self.config = {**DEFAULTS, **config}
        self.credential = credential_ref(name, self.config["auth"])
        self.wire = Wire(name, self.config.get("base_url"), credential=self.credential, options=self.config)
        if not (self.config["by_request_id"] or self.config["by_idempotency_key"]):
            raise ImproperlyConfigured(f"reconciler {name!r}: give by_request_id, by_idempotency_key or both")

    def lookup(self, operation: Operation, *, request_id: str = "", now: datetime | None = None) -> Lookup:
        """By the provider request id when one is known (the operation's, or ``request_id``
        from the case's evidence) and configured; else, or when that id is not found, by the
        idempotency key."""
        known = provider_ref.reference(operation, provider_ref.phase_now())  # the lookups checked it agrees
        request_id = (known.id if known is not None else "") or request_id
        if request_id and self.config["by_request_id"]:
            found = self._ask(self.config["by_request_id"], provider_request_id=request_id)
            if found.verdict != Verdict.DID_NOT_HAPPEN or not self.config["by_idempotency_key"]:
                return found
        if not self.config["by_idempotency_key"]:
            return Lookup(Verdict.CANNOT_TELL, asked="", why="no request id to look up, and no lookup by key")
        found = self._ask(self.config["by_idempotency_key"], idempotency_key=operation.idempotency_key)
        retention = self.config["key_retention_s"]
        dispatched = operation.dispatched_at or operation.created_at
        if (
            found.verdict == Verdict.DID_NOT_HAPPEN
            and retention is not None
            and dispatched < (now or timezone.now()) - timedelta(seconds=retention)
        ):
            return Lookup(
                Verdict.CANNOT_TELL,
                asked=found.asked,
                status=found.status,
                answer_digest=found.answer_digest,
                why=f"not found by key, but the provider forgets keys after {retention} s",
            )
        return found

    def _ask(self, template: str, **values: str) -> Lookup:
        path = template.format(**{k: quote(v, safe="") for k, v in values.items()})
        answer = self.wire.get(path)  # raises ProviderUnavailable: 5xx, throttled, no answer
        body, status = answer.body, answer.status
        seen: dict[str, Any] = {"asked": answer.asked, "status": status, "answer_digest": answer.digest}
        if status in self.config["not_found_status"]:
            return Lookup(Verdict.DID_NOT_HAPPEN, why=f"the provider has no such record (status {status})", **seen)
        if status != 200:
            return Lookup(Verdict.CANNOT_TELL, why=f"the provider answered status {status}", **seen)
        try:
            record = json.loads(body)
        except ValueError:
            return Lookup(Verdict.CANNOT_TELL, why="the answer is not JSON", **seen)
        return self._read(record, seen)

    def _unmapped(self, state: object) -> str:
        """Why a record's status decides nothing, for the person who gets the case. The
        provider's own value is not echoed: it would go into the chain."""
        field = self.config["status_field"]
        lists = "; ".join(
            f"{label}: {', '.join(map(str, self.config[key])) or 'none'}"
            for key, label in (("happened", "happened"), ("did_not_happen", "did not happen"), ("pending", "pending"))
        )
        found = f"has no {field!r}" if state is None else f"has a {field!r} that this reconciler does not map"
        return (
            f"the provider found the record, but it {found} ({lists}): "
            "look the record up at the provider and resolve the case by hand"
        )

    def _read(self, record: object, seen: dict[str, Any]) -> Lookup:
        request_id = _field(record, self.config["id_field"])
        state = _field(record, self.config["status_field"]) if self.config["status_field"] else None
        cost = _field(record, self.config["cost_field"]) if self.config["cost_field"] else None
        cost = cost if type(cost) is int and cost >= 0 else None
        rid = str(request_id) if isinstance(request_id, (str, int)) and str(request_id) else ""
        if self.config["status_field"]:
            if state in self.config["pending"]:
                return Lookup(Verdict.PENDING, why=f"the provider's record is {state}", provider_request_id=rid, **seen)
            if state in self.config["did_not_happen"]:
                return Lookup(Verdict.DID_NOT_HAPPEN, why=f"the provider's record is {state}", **seen)
            if state not in self.config["happened"]:
                return Lookup(Verdict.CANNOT_TELL, why=self._unmapped(state), **seen)
        if not rid:
            return Lookup(Verdict.CANNOT_TELL, why=f"the answer has no {self.config['id_field']}", **seen)
        return Lookup(
            Verdict.HAPPENED,
            provider_request_id=rid[:200],
            actual_cost_cents=cost,
            why=f"the provider has {rid[:60]}" + (f" ({state})" if state else ""),
            **seen,
        )


def _field(record: object, path: str | None) -> object:
    if not path:
        return None
    for name in path.split("."):
        if not isinstance(record, dict):
            return None
        record = record.get(name)
    return record
