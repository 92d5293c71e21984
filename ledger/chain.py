"""The evidence chain's exact form: canonical bytes and hashes.

The one definition lives in :mod:`ledger.evidence_verifier`, a standard-library-only
module that can be copied to a clean host to verify an exported chain without Fenceline;
this module re-exports its names for the rest of the project.

canonical(event) = JSON of {run_id, seq, event_id, type, schema_version, actor,
occurred_at, fields, prev_hash}, keys sorted, separators (",", ":"), UTF-8,
ensure_ascii false; occurred_at in UTC, ISO-8601 with microseconds and a trailing Z.
hash = "sha256:" + hex(SHA-256(canonical bytes)).
"""

from ledger.evidence_verifier import (
    GENESIS_HASH,
    HASH_PREFIX,
    VERIFIER_VERSION,
    canonical_bytes,
    checkpoint_mac,
    event_hash,
    format_time,
    hash_bytes,
)

__all__ = [
    "GENESIS_HASH",
    "HASH_PREFIX",
    "VERIFIER_VERSION",
    "canonical_bytes",
    "checkpoint_mac",
    "event_hash",
    "format_time",
    "hash_bytes",
]
