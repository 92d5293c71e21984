"""The evidence chain's exact form: canonical bytes and hashes, and an event as a document.

The one definition lives in :mod:`fenceline_client.evidence_verifier` (the worker side,
``clients/python``), a standard-library-only module that can be copied to a clean host to
verify an exported chain without Fenceline; this module re-exports its names for the rest of
the project and turns a stored event into the document that export, the verifier and the
tests all read.

canonical(event) = JSON of {run_id, seq, event_id, type, schema_version, actor,
occurred_at, fields, prev_hash}, keys sorted, separators (",", ":"), UTF-8,
ensure_ascii false; occurred_at in UTC, ISO-8601 with microseconds and a trailing Z.
hash = "sha256:" + hex(SHA-256(canonical bytes)).
Beside the hash, outside the canonical form: mac_key_id and mac = "hmac-sha256:" +
hex(HMAC-SHA256(event key, canonical JSON of {run_id, seq, hash, key_id})).
"""

from collections.abc import Mapping
from typing import Any

from fenceline_client.evidence_verifier import (
    GENESIS_HASH,
    HASH_PREFIX,
    ROW_COLUMNS,
    VERIFIER_VERSION,
    EventSigner,
    canonical_bytes,
    canonical_json,
    checkpoint_mac,
    event_hash,
    event_mac,
    format_time,
    hash_bytes,
)

# The stored columns of an event that its document is made of (run_id aside): the
# standalone verifier's row, defined there once.
EVENT_COLUMNS = ROW_COLUMNS


def event_document(event: Any, run_id: object = None) -> dict[str, Any]:
    """A stored event as the chain's document: every field of the canonical form with ids
    as strings and ``occurred_at`` formatted, plus its ``hash``, ``mac_key_id`` and ``mac``.
    ``event`` is an Event row
    or a mapping of EVENT_COLUMNS (the verifier streams ``values()`` rows); ``run_id``
    defaults to the row's own."""
    if isinstance(event, Mapping):
        run = run_id if run_id is not None else event["run_id"]
        values = {"run_id": str(run), **{name: event[name] for name in EVENT_COLUMNS}}
    else:
        run = run_id if run_id is not None else event.run_id
        values = {"run_id": str(run), **{name: getattr(event, name) for name in EVENT_COLUMNS}}
    values["event_id"] = str(values["event_id"])
    values["occurred_at"] = format_time(values["occurred_at"])
    return values


__all__ = [
    "EVENT_COLUMNS",
    "GENESIS_HASH",
    "HASH_PREFIX",
    "VERIFIER_VERSION",
    "EventSigner",
    "canonical_bytes",
    "canonical_json",
    "checkpoint_mac",
    "event_document",
    "event_hash",
    "event_mac",
    "format_time",
    "hash_bytes",
]
