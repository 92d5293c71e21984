"""The data planes (the secret-boundary article; docs/architecture.md "Data planes").

* control: the chain (``ledger.services.evidence.append``), kept for good.
* diagnostic: what an event carries beyond its control fields — a worker event's
  ``payload`` — kept in :class:`DiagnosticPayload` rows,
  raw payloads allowed (the control plane's boundary refuses them), credentials never,
  readable by the tenant's operators and admins (not its viewers), removed past the
  tenant's retention for its class (``ledger.services.evidence.retention``). The event
  commits to the payload by digest (event schema version 2), so a removal leaves every chain
  verifying. The plane's other classes stay where they are kept and are removed there:
  superseded checkpoint states, superseded boots' evidence, quarantine bundles.
* user content: refused unless the tenant opted in (``Tenant.user_content_opt_in``); then
  kept as a diagnostic payload of class ``user_content``, encrypted with AES-256-GCM under
  FENCELINE["USER_CONTENT_KEYS"] (the digest is of the stored, encrypted form, so any
  verifier checks it without the key).
* secrets: never, in any plane: every payload passes the secret boundary first.
"""

import base64
import hashlib
import json
import os
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

from fenceline_client.evidence_verifier import (
    PAYLOAD_CLASS,
    PAYLOAD_DIGEST,
    PAYLOAD_VERSION,
    canonical_json,
    payload_digest,
)
from ledger.errors import InvalidInput, KeyUnavailable, UserContentRefused
from ledger.models import DiagnosticPayload, Event, Run, Tenant
from ledger.services.evidence.append import ChainBatch, checked_document

EVENT_PAYLOAD = "event_payload"
USER_CONTENT = "user_content"
CHECKPOINT_STATE = "checkpoint_state"
BOOT_EVIDENCE = "boot_evidence"
BUNDLE = "bundle"
# The classes of DiagnosticPayload rows (the chain commits to each by digest).
PAYLOAD_CLASSES = (EVENT_PAYLOAD, USER_CONTENT)
# Every class of the diagnostic plane, each with its own retention per tenant
# (FENCELINE["RETENTION_DAYS"], Tenant.retention_days): the payloads; a superseded progress
# checkpoint's state (the chain keeps its digest); a superseded boot's readiness evidence
# and error message; a quarantine decision's diagnostic bundle.
RETENTION_CLASSES = (*PAYLOAD_CLASSES, CHECKPOINT_STATE, BOOT_EVIDENCE, BUNDLE)
# What a worker may send as an event's payload_class.
WORKER_PAYLOAD_CLASSES = (EVENT_PAYLOAD, USER_CONTENT)
MAX_PAYLOAD_BYTES = 64 * 1024
USER_CONTENT_ALGORITHM = "AES-256-GCM"


def payload_append(
    batch: ChainBatch,
    run: Run,
    type: str,
    *,
    actor: str,
    fields: dict[str, Any],
    payload: dict[str, Any],
    klass: str,
) -> Event:
    """Append to ``run``'s chain an event of ``fields`` that commits to ``payload`` by its
    digest, and keep the payload in the diagnostic plane, in the caller's transaction (the
    run row locked). ``payload`` has passed :func:`checked_payload`."""
    stored = _stored(run, payload, klass)
    digest = payload_digest(stored)
    event = batch.append(
        run,
        type,
        actor=actor,
        fields={**fields, PAYLOAD_DIGEST: digest, PAYLOAD_CLASS: klass},
        schema_version=PAYLOAD_VERSION,
    )
    DiagnosticPayload.objects.create(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        seq=event.seq,
        klass=klass,
        digest=digest,
        body=stored,
        size=len(canonical_json(stored)),
        created_at=batch.now,
    )
    return event


def checked_payload(tenant: Tenant, fields: dict[str, Any], payload: object, klass: str) -> dict[str, Any]:
    """A worker's payload as it may be kept: a JSON object of at most MAX_PAYLOAD_BYTES
    through the storage check and the secret boundary, of a class the tenant accepts;
    else InvalidInput naming the field."""
    if klass not in WORKER_PAYLOAD_CLASSES:
        raise InvalidInput(f"payload_class must be one of {', '.join(WORKER_PAYLOAD_CLASSES)}", field="payload_class")
    if klass == USER_CONTENT and not tenant.user_content_opt_in:
        raise UserContentRefused(
            "this tenant does not accept user content (an admin may opt in: docs/architecture.md)",
            field="payload_class",
        )
    for reserved in (PAYLOAD_DIGEST, PAYLOAD_CLASS):
        if reserved in fields:
            raise InvalidInput(f"fields.{reserved} is reserved for the payload's reference", field=f"fields.{reserved}")
    # Raw payloads (error text, tool output) are what this plane is for; credentials never are.
    return checked_document(payload, field="payload", max_bytes=MAX_PAYLOAD_BYTES, raw_payloads=True)


def _stored(run: Run, payload: dict[str, Any], klass: str) -> dict[str, Any]:
    """The payload as kept: user content encrypted, everything else as it is."""
    if klass != USER_CONTENT:
        return payload
    key_id = settings.FENCELINE["USER_CONTENT_KEY_ID"]
    nonce = os.urandom(12)
    sealed = _cipher(key_id).encrypt(nonce, canonical_json(payload), _associated(run.pk, key_id))
    return {
        "alg": USER_CONTENT_ALGORITHM,
        "key_id": key_id,
        "nonce": base64.b64encode(nonce).decode(),
        "ciphertext": base64.b64encode(sealed).decode(),
    }


def opened(run_id: object, klass: str, body: dict[str, Any]) -> dict[str, Any]:
    """A kept payload as it was sent: user content decrypted (the run it was sealed for),
    anything else as it is."""
    if klass != USER_CONTENT:
        return body
    plain = _cipher(body["key_id"]).decrypt(
        base64.b64decode(body["nonce"]), base64.b64decode(body["ciphertext"]), _associated(run_id, body["key_id"])
    )
    document: dict[str, Any] = json.loads(plain)
    return document


def _cipher(key_id: str) -> AESGCM:
    secret = settings.FENCELINE["USER_CONTENT_KEYS"].get(key_id)
    if secret is None:
        raise KeyUnavailable(
            f"sealed under user-content key {key_id!r}, which this server does not hold (FENCELINE_USER_CONTENT_KEYS)"
        )
    return AESGCM(hashlib.sha256(secret).digest())


def _associated(run_id: object, key_id: str) -> bytes:
    return f"fenceline user content|{run_id}|{key_id}".encode()


def retention_days(tenant: Tenant, klass: str) -> int:
    """Days a payload of ``klass`` of ``tenant`` is kept: the tenant's own, else the default."""
    own = tenant.retention_days.get(klass) if isinstance(tenant.retention_days, dict) else None
    if type(own) is int and own >= 0:
        return own
    days: int = settings.FENCELINE["RETENTION_DAYS"][klass]
    return days


def removal_cutoff(tenant: Tenant, klass: str, now: datetime) -> datetime:
    """Payloads of ``klass`` of ``tenant`` created before this moment are past their retention."""
    return now - timedelta(days=retention_days(tenant, klass))
