"""The evidence chain's exact form: canonical bytes and hashes.

Standard library only, so that the same definition can be read, and re-implemented, by
anyone who verifies an exported chain without Fenceline.

canonical(event) = JSON of {run_id, seq, event_id, type, schema_version, actor,
occurred_at, fields, prev_hash}, keys sorted, separators (",", ":"), UTF-8,
ensure_ascii false; occurred_at in UTC, ISO-8601 with microseconds and a trailing Z.
hash = "sha256:" + hex(SHA-256(canonical bytes)).
"""

import hashlib
import json
from datetime import datetime, timezone

HASH_PREFIX = "sha256:"
GENESIS_HASH = HASH_PREFIX + "0" * 64


def format_time(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("occurred_at must be timezone-aware")
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical_bytes(
    *,
    run_id: str,
    seq: int,
    event_id: str,
    type: str,
    schema_version: int,
    actor: str,
    occurred_at: str,
    fields: dict,
    prev_hash: str,
) -> bytes:
    document = {
        "run_id": run_id,
        "seq": seq,
        "event_id": event_id,
        "type": type,
        "schema_version": schema_version,
        "actor": actor,
        "occurred_at": occurred_at,
        "fields": fields,
        "prev_hash": prev_hash,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def hash_bytes(data: bytes) -> str:
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()
