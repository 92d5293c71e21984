#!/usr/bin/env python3
"""Fenceline evidence verifier: the one definition of a run's evidence chain, and its check.

Self-contained on purpose: it imports only the Python standard library, so the file can be
copied to a clean host and run against an exported chain without Fenceline or Django (or run
as ``fenceline-verify`` where the ``fenceline-client`` distribution is installed):

    python evidence_verifier.py EXPORT.json --keys KEYS.json [--event-keys EVENT_KEYS.json]
                                [--trusted SEQ:HASH] [--json]

EXPORT.json is what ``GET /api/v1/runs/{run_id}/events`` returns:
``{"run_id": ..., "events": [...], "checkpoints": [...], "head": {"last_seq", "last_hash"}}``
("checkpoints" and "head" may be absent). KEYS.json maps checkpoint key ids to secrets,
written ``"hex:..."`` or ``"base64:..."``; EVENT_KEYS.json maps event key ids to secrets the
same way. Without --event-keys the events' MACs are not checked, and the report says so on
its first line. Exit status: 0 VERIFIED, 1 UNSEALED, 2 BROKEN, 3 bad input (one line on
stderr saying why).

The chain's exact form
----------------------
canonical(event) = JSON of {run_id, seq, event_id, type, schema_version, actor, occurred_at,
fields, prev_hash}: keys sorted, separators (",", ":"), UTF-8, ensure_ascii false, no NaN;
occurred_at is UTC ISO-8601 with microseconds and a trailing Z; ids are strings.
hash = "sha256:" + hex(SHA-256(canonical bytes)); seq starts at 1; the prev_hash of seq 1
is GENESIS_HASH ("sha256:" + 64 zeros).

Each event also carries a MAC beside its hash, made by Fenceline when it appends the event:
mac_key_id names the key, and mac = "hmac-sha256:" + hex(HMAC-SHA256(event_keys[mac_key_id],
canonical JSON of {run_id, seq, hash, key_id})) where key_id is the mac_key_id, with the same
JSON rules. The hash chain alone can be extended by anyone who knows the algorithm; the MAC
says that the holder of the event key wrote this event at this seq with this hash. Events
written before MACs existed have an empty mac; the verifier accepts them only at the start of
a chain, before the first event with a MAC, and only where a checkpoint covers them (the
checkpoint's MAC then vouches for them).

A checkpoint states "the chain of run R up to seq N ends in last_hash":
mac = "hmac-sha256:" + hex(HMAC-SHA256(keys[key_id], canonical JSON of {run_id, seq,
last_hash, verifier_version, key_id})), with the same JSON rules. Keys are looked up by
id, so checkpoints signed before a key rotation keep verifying while the old key is kept.

Payloads committed by digest (event schema version 2)
----------------------------------------------------
An event of schema_version 2 keeps its diagnostic payload beside the chain, not in it: its
fields hold "payload_digest" = "sha256:" + hex(SHA-256(canonical JSON of the payload)) and
"payload_class", and the hash covers that digest, not the payload's bytes.
An export gives each such event, beside its canonical fields, one of: "payload" (the
payload itself, checked against the digest: other bytes are tampering, reason
payload_mismatch), "payload_removed" ({"by": "retention", "at": ...}: removed past its
retention, which the chain allows: the report counts it and says "payload removed by
retention"), or "payload_withheld" (true: the reader may not see diagnostic payloads; not
checked). A version-2 event with none of them, or whose fields name no digest, is
payload_missing. Version 1 events are hashed as they always were.

What the verifier reports
-------------------------
``verify_chain`` reads the events once, in the order stored (ascending seq), with one event
of lookahead, and stops at the FIRST bad seq. Its report says VERIFIED (no finding, and the
last trusted checkpoint is at the head), UNSEALED (no finding, head beyond the last trusted
checkpoint or no checkpoint at all) or BROKEN (a finding: reason and exact seq range).
See ``verify_chain`` for the rules and the reasons.

Memory is bounded: besides the lookahead it keeps the phase of each operation_id (for the
transition rules) and the event ids of the last DUPLICATE_WINDOW events. A repeated
event_id is therefore detected only when the earlier occurrence is within the previous
DUPLICATE_WINDOW events; a caller with a database can ask it for global uniqueness.
"""

import sys

if __name__ == "__main__":  # run as a script: keep sibling files from shadowing the stdlib
    import os

    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _here:
        del sys.path[0]

import argparse
import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import json.encoder
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring as _json_string  # the encoder's own string form
from typing import Any, NoReturn, TypeGuard

# CPython's C encoder, called directly: one call per document, nothing built per call (None
# on an interpreter without the accelerator).
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)

__all__ = [
    "BROKEN",
    "CHECKPOINT_MAC_PREFIX",
    "DUPLICATE_WINDOW",
    "EVENT_MAC_PREFIX",
    "GENESIS_HASH",
    "HASH_PREFIX",
    "MACS_CHECKED",
    "MACS_NOT_CHECKED",
    "PAYLOAD_CLASS",
    "PAYLOAD_DIGEST",
    "PAYLOAD_VERSION",
    "PHASE_TRANSITIONS",
    "REASONS",
    "REMOVED_BY_RETENTION",
    "ROW_COLUMNS",
    "UNSEALED",
    "VERIFIED",
    "VERIFIER_VERSION",
    "Finding",
    "InputError",
    "PayloadCheck",
    "Report",
    "canonical_bytes",
    "canonical_json",
    "checkpoint_mac",
    "event_hash",
    "event_mac",
    "event_mac_message",
    "format_time",
    "hash_bytes",
    "main",
    "payload_digest",
    "payload_reference",
    "row_document",
    "verify_chain",
    "verify_rows",
]

# --- the exact form -----------------------------------------------------------------------

HASH_PREFIX = "sha256:"
GENESIS_HASH = HASH_PREFIX + "0" * 64
CHECKPOINT_MAC_PREFIX = "hmac-sha256:"
EVENT_MAC_PREFIX = "hmac-sha256:"
VERIFIER_VERSION = "1"


# json.dumps(document, **these) is JSONEncoder(**these).encode(document): one encoder serves.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(document: object) -> bytes:
    """Sorted keys, no whitespace, UTF-8 without escaping, NaN and Infinity refused."""
    return _CANONICAL.encode(document).encode()


if _c_make_encoder is not None:
    # What _CANONICAL.encode runs for a dict, made once (no check for cycles: a document
    # decoded from JSON text has none).
    _canonical_c = _c_make_encoder(None, _CANONICAL.default, _json_string, None, ":", ",", True, False, False)

    def _canonical_text(document: dict[str, Any]) -> str:
        return "".join(_canonical_c(document, 0))

else:  # pragma: no cover

    def _canonical_text(document: dict[str, Any]) -> str:
        return _CANONICAL.encode(document)


def format_time(moment: datetime) -> str:
    """A timezone-aware moment as UTC ISO-8601 with microseconds and a trailing Z."""
    if moment.tzinfo is None:
        raise ValueError("occurred_at must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical_bytes(
    *,
    run_id: str,
    seq: int,
    event_id: str,
    type: str,
    schema_version: int,
    actor: str,
    occurred_at: str,
    fields: dict[str, Any],
    prev_hash: str,
) -> bytes:
    return canonical_json(
        {
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
    )


def hash_bytes(data: bytes) -> str:
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()


def event_hash(event: Mapping[str, Any]) -> str:
    """The hash of an event given as a dict with the canonical keys (extra keys, such as
    its stored "hash", are ignored)."""
    return hash_bytes(
        canonical_bytes(
            run_id=event["run_id"],
            seq=event["seq"],
            event_id=event["event_id"],
            type=event["type"],
            schema_version=event["schema_version"],
            actor=event["actor"],
            occurred_at=event["occurred_at"],
            fields=event["fields"],
            prev_hash=event["prev_hash"],
        )
    )


def checkpoint_mac(key: bytes, *, run_id: str, seq: int, last_hash: str, verifier_version: str, key_id: str) -> str:
    message = canonical_json(
        {
            "run_id": run_id,
            "seq": seq,
            "last_hash": last_hash,
            "verifier_version": verifier_version,
            "key_id": key_id,
        }
    )
    return CHECKPOINT_MAC_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def event_mac_message(*, run_id: str, seq: int, hash: str, key_id: str) -> bytes:
    """The bytes an event's MAC is computed over."""
    return canonical_json({"run_id": run_id, "seq": seq, "hash": hash, "key_id": key_id})


def event_mac(key: bytes, *, run_id: str, seq: int, hash: str, key_id: str) -> str:
    message = event_mac_message(run_id=run_id, seq=seq, hash=hash, key_id=key_id)
    return EVENT_MAC_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


_SHA256_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


class EventSigner:
    """One event key, already absorbed into the two SHA-256 states of HMAC (RFC 2104, what
    ``hmac`` computes): a MAC costs two copies and two updates, not a key schedule per event."""

    __slots__ = ("_inner", "_outer", "key", "key_id")

    def __init__(self, key_id: str, key: bytes) -> None:
        self.key_id = key_id
        self.key = key
        block = hashlib.sha256(key).digest() if len(key) > _SHA256_BLOCK else key
        block = block.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(block.translate(_IPAD))
        self._outer = hashlib.sha256(block.translate(_OPAD))

    def mac(self, *, run_id: str, seq: int, hash: str) -> str:
        return self.mac_of(event_mac_message(run_id=run_id, seq=seq, hash=hash, key_id=self.key_id))

    def mac_of(self, message: bytes) -> str:
        """The MAC of an event whose MAC message (``event_mac_message``) is ``message``."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return EVENT_MAC_PREFIX + outer.hexdigest()


# --- operation phases (a copy of ledger.states.PHASE_TRANSITIONS, kept equal by a test) ----

PHASE_TRANSITIONS: dict[str, frozenset[str]] = {
    "PLANNED": frozenset({"AUTHORIZED", "DENIED", "PENDING_APPROVAL"}),
    "PENDING_APPROVAL": frozenset({"AUTHORIZED", "DENIED"}),
    "AUTHORIZED": frozenset({"DISPATCHED", "DENIED"}),
    "DENIED": frozenset(),
    "DISPATCHED": frozenset({"CONFIRMED", "FAILED", "UNKNOWN"}),
    "CONFIRMED": frozenset(),
    "FAILED": frozenset({"PLANNED"}),
    "UNKNOWN": frozenset({"RECONCILED"}),
    "RECONCILED": frozenset({"PLANNED"}),
}
OPERATION_PREFIX = "OPERATION_"
START_PHASE = "PLANNED"

# --- the report -------------------------------------------------------------------------

VERIFIED = "VERIFIED"
UNSEALED = "UNSEALED"
BROKEN = "BROKEN"

GAP = "gap"
REORDER = "reorder"
DUPLICATE = "duplicate"
MUTATED = "mutated"
PREV_HASH_MISMATCH = "prev_hash_mismatch"
ILLEGAL_TRANSITION = "illegal_transition"
CHECKPOINT_MISMATCH = "checkpoint_mismatch"
ROLLBACK = "rollback"
FORK = "fork"
MAC_MISSING = "mac_missing"
MAC_UNKNOWN_KEY_ID = "mac_unknown_key_id"
MAC_MISMATCH = "mac_mismatch"
PAYLOAD_MISMATCH = "payload_mismatch"
PAYLOAD_MISSING = "payload_missing"
REASONS = (
    GAP,
    REORDER,
    DUPLICATE,
    MUTATED,
    PREV_HASH_MISMATCH,
    ILLEGAL_TRANSITION,
    CHECKPOINT_MISMATCH,
    ROLLBACK,
    FORK,
    MAC_MISSING,
    MAC_UNKNOWN_KEY_ID,
    MAC_MISMATCH,
    PAYLOAD_MISMATCH,
    PAYLOAD_MISSING,
)

# Report.event_macs: whether the events' MACs were checked (event keys given) or not.
MACS_CHECKED = "checked"
MACS_NOT_CHECKED = "not_checked"

# How many previous event ids a repeated event_id is looked for among.
DUPLICATE_WINDOW = 1024
_NEVER = -(1 << 62)  # the count of an event id never seen: below any window

EVENT_KEYS = (
    "run_id",
    "seq",
    "event_id",
    "type",
    "schema_version",
    "actor",
    "occurred_at",
    "fields",
    "prev_hash",
    "hash",
)
# Beside the canonical form and hash: the event's MAC and the id of the key it is under.
EVENT_MAC_KEYS = ("mac_key_id", "mac")
_EVENT_TYPES = {
    "run_id": str,
    "event_id": str,
    "type": str,
    "schema_version": int,
    "actor": str,
    "occurred_at": str,
    "fields": dict,
    "prev_hash": str,
    "hash": str,
}
CHECKPOINT_KEYS = ("run_id", "seq", "last_hash", "verifier_version", "key_id", "mac")


class InputError(ValueError):
    """The input cannot be read as a chain at all (not a finding about the evidence)."""


@dataclass(frozen=True)
class Finding:
    reason: str  # one of REASONS
    first_seq: int
    last_seq: int
    detail: str


@dataclass
class Report:
    """The verdict on one run.

    ``events_checked``, ``head_seq`` and ``head_hash`` describe the verified prefix: the
    events accepted before the first finding (the whole chain when there is none), with the
    recomputed hash of the last one (GENESIS_HASH and 0 for an empty prefix).
    ``last_trusted_checkpoint`` is the seq of the highest checkpoint whose MAC verifies and
    whose last_hash equals the recomputed chain hash at its seq, before any finding.
    ``event_macs`` is MACS_CHECKED when event keys were given (every accepted event's MAC
    verified, apart from ``unsigned_events`` legacy events a checkpoint covers) or
    MACS_NOT_CHECKED: then VERIFIED speaks for the hash chain and the checkpoints only."""

    run_id: str
    status: str
    events_checked: int
    head_seq: int
    head_hash: str
    last_trusted_checkpoint: int | None
    finding: Finding | None = None
    verifier_version: str = field(default=VERIFIER_VERSION)
    event_macs: str = MACS_CHECKED
    unsigned_events: int = 0
    # Payloads of version-2 events: checked against their digest, removed by retention
    # (the first REMOVED_SEQS_SHOWN of their seqs kept), withheld from the reader.
    payloads_checked: int = 0
    payloads_removed: int = 0
    payloads_removed_seqs: list[int] = field(default_factory=list)
    payloads_withheld: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """A few lines for humans."""
        trusted = "none" if self.last_trusted_checkpoint is None else f"seq {self.last_trusted_checkpoint}"
        macs = "" if self.event_macs == MACS_CHECKED else " (event MACs NOT checked: no event keys given)"
        lines = [f"run {self.run_id}: {self.status}{macs}"]
        if self.finding is not None:
            f = self.finding
            lines.append(f"first bad seq: {f.first_seq} (range {f.first_seq}..{f.last_seq}), reason: {f.reason}")
            lines.append(f"detail: {f.detail}")
            lines.append(f"verified prefix: {self.events_checked} events, up to seq {self.head_seq} ({self.head_hash})")
        else:
            lines.append(f"events checked: {self.events_checked}, head: seq {self.head_seq} ({self.head_hash})")
            if self.status == UNSEALED:
                lines.append(
                    f"unsealed: seq {(self.last_trusted_checkpoint or 0) + 1}..{self.head_seq} "
                    "is not covered by a trusted checkpoint"
                )
        lines.append(f"last trusted checkpoint: {trusted}")
        if self.event_macs == MACS_CHECKED:
            legacy = f", {self.unsigned_events} legacy events without one" if self.unsigned_events else ""
            lines.append(f"event MACs: checked ({self.events_checked - self.unsigned_events} verified{legacy})")
        else:
            lines.append("event MACs: not checked (pass --event-keys to check them)")
        if self.payloads_checked or self.payloads_removed or self.payloads_withheld:
            lines.append(
                f"payloads: {self.payloads_checked} checked against their digest, "
                f"{self.payloads_removed} removed by retention, {self.payloads_withheld} withheld"
            )
        if self.payloads_removed:
            seqs = ", ".join(map(str, self.payloads_removed_seqs))
            more = ", ..." if self.payloads_removed > len(self.payloads_removed_seqs) else ""
            lines.append(f"payload removed by retention: seq {seqs}{more} (the chain commits to their digests)")
        return "\n".join(lines)


class _Stop(Exception):
    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.reason)
        self.finding = finding


class _End:
    """The end of the event stream (a sentinel no event can be)."""


def _int(value: object) -> TypeGuard[int]:
    return type(value) is int


def _recompute(event: Mapping[str, Any], seq: int | None = None) -> str | None:
    """The event's hash (under ``seq`` instead of its own, if given); None when the event
    cannot be put in canonical form."""
    try:
        document = dict(event)
        if seq is not None:
            document["seq"] = seq
        return event_hash(document)
    except (KeyError, TypeError, ValueError):
        return None


def _seq_of(event: object, position: int) -> int:
    if not isinstance(event, Mapping):
        raise InputError(f"event #{position} is not an object")
    seq = event.get("seq")
    if not _int(seq):
        raise InputError(f"event #{position} has no integer seq")
    return seq


def _peek_seq(event: object) -> int | None:
    seq = event.get("seq") if isinstance(event, Mapping) else None
    return seq if _int(seq) else None


class _Verifier:
    def __init__(
        self,
        run_id: str,
        checkpoints: Iterable[Mapping[str, Any]],
        keys: Mapping[str, bytes],
        expected_head: tuple[int, str] | None,
        trusted: tuple[int, str] | None,
        event_keys: Mapping[str, bytes] | None = None,
    ) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise InputError("run_id must be a non-empty string")
        self.run_id = run_id
        self.keys = keys
        self.expected_head = _pair(expected_head, "expected_head")
        self.trusted = _pair(trusted, "trusted")
        if self.trusted is not None and self.trusted[0] < 1:
            self.trusted = None
        self.checkpoints: Iterator[Mapping[str, Any]] = iter(checkpoints)
        self.pending_cp: Mapping[str, Any] | None = None
        self.cp_position = 0
        self.last_cp_seq = 0
        self.newest_cp_seq = 0
        self.head_seq = 0
        self.head_hash = GENESIS_HASH
        self.checked = 0
        self.trusted_cp: int | None = None
        self.phases: dict[object, str] = {}
        # The event ids of the last ``window`` accepted events: id -> its count of accepted
        # events (``checked``) when it was accepted; older ids are dropped now and then.
        self.window = DUPLICATE_WINDOW
        self.recent: dict[str, int] = {}
        self.signers: dict[str, EventSigner] | None = None
        if event_keys is not None:
            if not isinstance(event_keys, Mapping) or not all(
                isinstance(k, str) and isinstance(v, bytes) and v for k, v in event_keys.items()
            ):
                raise InputError("event_keys must map key ids to non-empty bytes")
            self.signers = {key_id: EventSigner(key_id, key) for key_id, key in event_keys.items()}
        self.signed_seen = False
        self.unsigned = 0
        self._next_checkpoint()
        self._plan_anchors()

    # -- checkpoints --

    def _next_checkpoint(self) -> None:
        cp = next(self.checkpoints, None)
        self.cp_position += 1
        if cp is None:
            self.pending_cp = None
            return
        if not isinstance(cp, Mapping) or not _int(cp.get("seq")):
            raise InputError(f"checkpoint #{self.cp_position} has no integer seq")
        if cp["seq"] < self.last_cp_seq:
            raise InputError("checkpoints must be given in ascending seq order")
        self.last_cp_seq = cp["seq"]
        self.newest_cp_seq = max(self.newest_cp_seq, cp["seq"])
        self.pending_cp = cp

    def _mac_problem(self, cp: Mapping[str, Any]) -> str | None:
        for name in CHECKPOINT_KEYS:
            if name != "seq" and not isinstance(cp.get(name), str):
                return f"checkpoint at seq {cp['seq']} has no string {name!r}"
        if cp["run_id"] != self.run_id:
            return f"checkpoint at seq {cp['seq']} belongs to run {cp['run_id']!r}"
        if cp["verifier_version"] != VERIFIER_VERSION:
            return (
                f"checkpoint at seq {cp['seq']} has verifier_version {cp['verifier_version']!r}; "
                f"this verifier checks version {VERIFIER_VERSION!r}"
            )
        key = self.keys.get(cp["key_id"])
        if key is None:
            return f"checkpoint at seq {cp['seq']} is signed with unknown key id {cp['key_id']!r}"
        expected = checkpoint_mac(
            key,
            run_id=cp["run_id"],
            seq=cp["seq"],
            last_hash=cp["last_hash"],
            verifier_version=cp["verifier_version"],
            key_id=cp["key_id"],
        )
        if not hmac.compare_digest(expected.encode(), cp["mac"].encode()):
            return f"the MAC of the checkpoint at seq {cp['seq']} (key id {cp['key_id']!r}) does not verify"
        return None

    def _check_checkpoints_at(self, seq: int, chain_hash: str) -> None:
        """Checkpoints at (or, malformed, before) ``seq``, whose chain hash is known now."""
        while self.pending_cp is not None and self.pending_cp["seq"] <= seq:
            cp = self.pending_cp
            problem = self._mac_problem(cp)
            if problem is None and cp["seq"] != seq:
                problem = f"checkpoint seq {cp['seq']} is not a seq of the chain"
            if problem is None and cp["last_hash"] != chain_hash:
                problem = (
                    f"the checkpoint at seq {seq} says the chain ends in {cp['last_hash']}, but it recomputes "
                    f"to {chain_hash}: the events were rewritten somewhere in "
                    f"{(self.trusted_cp or 0) + 1}..{seq}"
                )
            if problem is not None:
                raise _Stop(Finding(CHECKPOINT_MISMATCH, cp["seq"], cp["seq"], problem))
            self.trusted_cp = seq
            self._next_checkpoint()

    # -- events --

    def _is_recent(self, event_id: str) -> bool:
        """``event_id`` is the id of one of the last ``window`` accepted events."""
        return self.recent.get(event_id, _NEVER) > self.checked - self.window

    def _forget_old_ids(self) -> None:
        floor = self.checked - self.window
        for event_id in [event_id for event_id, count in self.recent.items() if count <= floor]:
            del self.recent[event_id]

    def _swapped(self, event: Mapping[str, Any], following: Mapping[str, Any] | None) -> bool:
        """Rows seq and seq+1 exchanged: this row links to (or only hashes after) the next."""
        if following is None or _peek_seq(following) != event["seq"] + 1:
            return False
        if event.get("prev_hash") == following.get("hash"):
            return True
        return _recompute(event, event["seq"] + 1) == event.get("hash") and _recompute(
            following, event["seq"]
        ) == following.get("hash")

    def _check_mac(self, event: Mapping[str, Any], seq: int, digest: str) -> None:
        """The event's MAC under its key id, once the event is known to be the stored,
        linked event at ``seq`` (its hash recomputes to ``digest``)."""
        signers = self.signers
        if signers is None:
            return
        mac, key_id = event.get("mac"), event.get("mac_key_id")
        if mac is None or mac == "":
            # A legacy event (written before MACs): only before the first signed event, and
            # only under a checkpoint yet to come, whose MAC then vouches for it.
            covered = self.pending_cp is not None and self.pending_cp["seq"] >= seq
            if self.signed_seen or not covered or key_id not in (None, ""):
                why = "the events before it are signed" if self.signed_seen else "no checkpoint covers it"
                raise _Stop(Finding(MAC_MISSING, seq, seq, f"event {seq} has no MAC ({why})"))
            self.unsigned += 1
            return
        if not isinstance(mac, str) or not isinstance(key_id, str):
            raise _Stop(Finding(MAC_MISSING, seq, seq, f"event {seq} has no string 'mac' and 'mac_key_id'"))
        signer = signers.get(key_id)
        if signer is None:
            raise _Stop(Finding(MAC_UNKNOWN_KEY_ID, seq, seq, f"event {seq} is signed with unknown key id {key_id!r}"))
        expected = signer.mac(run_id=self.run_id, seq=seq, hash=digest)
        if not hmac.compare_digest(expected.encode(), mac.encode()):
            raise _Stop(
                Finding(
                    MAC_MISMATCH,
                    seq,
                    seq,
                    f"the MAC of event {seq} (key id {key_id!r}) does not verify: "
                    "not written with the event key at this seq with this hash",
                )
            )
        self.signed_seen = True

    def _transition(self, event: Mapping[str, Any]) -> tuple[object, str] | None:
        """For an OPERATION_* event, the (operation_id, new phase) it records; raises a
        finding when the move is not legal after what this chain has said so far."""
        kind = event["type"]
        if not kind.startswith(OPERATION_PREFIX):
            return None
        seq = event["seq"]

        def illegal(why: str) -> _Stop:
            return _Stop(Finding(ILLEGAL_TRANSITION, seq, seq, f"{kind} at seq {seq}: {why}"))

        target = kind[len(OPERATION_PREFIX) :]
        fields = event["fields"]
        operation = fields.get("operation_id")
        if not isinstance(operation, (str, int)) or isinstance(operation, bool):
            raise illegal("it names no operation_id")
        if target not in PHASE_TRANSITIONS:
            raise illegal(f"{target!r} is not an operation phase")
        if fields.get("to") != target:
            raise illegal(f"its 'to' is {fields.get('to')!r}, not {target!r}")
        last = self.phases.get(operation)
        if "from" not in fields:
            if target != START_PHASE:
                raise illegal("it has no 'from' phase")
            if last is not None:
                raise illegal(f"operation {operation} was already planned (it is {last})")
            return operation, target
        source = fields["from"]
        if last is None:
            raise illegal(f"operation {operation} was never planned in this chain")
        if source != last:
            raise illegal(f"it moves operation {operation} from {source!r}, but the operation is {last}")
        if target not in PHASE_TRANSITIONS[last]:
            raise illegal(f"{last} -> {target} is not a transition of the phase table")
        return operation, target

    def step(self, event: Mapping[str, Any], following: Mapping[str, Any] | None, position: int) -> None:
        seq = _seq_of(event, position)
        expected = self.head_seq + 1
        if seq < 1:
            raise _Stop(Finding(MUTATED, seq, seq, f"seq {seq} is below 1"))
        if seq < expected:
            raise _Stop(Finding(DUPLICATE, seq, seq, f"seq {seq} appears again after seq {self.head_seq}"))
        if seq > expected:
            if seq == expected + 1 and _peek_seq(following) == expected:
                raise _Stop(Finding(REORDER, expected, seq, f"seq {seq} is stored before seq {expected}"))
            missing = f"seq {expected}" if seq - 1 == expected else f"seqs {expected}..{seq - 1}"
            raise _Stop(Finding(GAP, expected, seq - 1, f"{missing} missing: seq {self.head_seq} is followed by {seq}"))
        if self.expected_head is not None and seq > self.expected_head[0]:
            raise _Stop(
                Finding(FORK, seq, seq, f"the chain continues past the run's recorded head seq {self.expected_head[0]}")
            )
        for name, kind in _EVENT_TYPES.items():
            value = event.get(name)
            if not isinstance(value, kind) or (kind is int and not _int(value)):
                raise _Stop(Finding(MUTATED, seq, seq, f"event {seq} has no valid {name!r}"))
        if event["run_id"] != self.run_id:
            raise _Stop(Finding(MUTATED, seq, seq, f"event {seq} belongs to run {event['run_id']!r}"))
        if self._is_recent(event["event_id"]):
            raise _Stop(
                Finding(DUPLICATE, seq, seq, f"event {seq} repeats event_id {event['event_id']} of an earlier event")
            )
        digest = _recompute(event)
        if digest is None:
            raise _Stop(Finding(MUTATED, seq, seq, f"event {seq} cannot be put in canonical form"))
        if digest != event["hash"]:
            if self._swapped(event, following):
                raise _Stop(Finding(REORDER, seq, seq + 1, f"the rows stored as seq {seq} and {seq + 1} are swapped"))
            if _recompute(event, seq + 1) == event["hash"]:
                raise _Stop(
                    Finding(
                        GAP,
                        seq,
                        seq,
                        f"the row stored as seq {seq} is the event hashed as seq {seq + 1}: "
                        f"event {seq} was removed and the later rows renumbered",
                    )
                )
            raise _Stop(Finding(MUTATED, seq, seq, f"event {seq} does not hash to its stored hash"))
        if event["prev_hash"] != self.head_hash:
            if self._swapped(event, following):
                raise _Stop(Finding(REORDER, seq, seq + 1, f"the rows stored as seq {seq} and {seq + 1} are swapped"))
            raise _Stop(
                Finding(
                    PREV_HASH_MISMATCH,
                    seq,
                    seq,
                    f"event {seq} links to {event['prev_hash']}, but the chain before it ends in {self.head_hash}",
                )
            )
        self._check_mac(event, seq, digest)
        self._accept(seq, digest, event["event_id"], self._transition(event))

    def _accept(self, seq: int, digest: str, event_id: str, moved: tuple[object, str] | None) -> None:
        """The event at ``seq``, hashing to ``digest``, passed every rule of its own: it
        extends the verified chain, and the anchors at its seq are checked."""
        self.head_seq, self.head_hash = seq, digest
        self.checked = checked = self.checked + 1
        recent = self.recent
        recent[event_id] = checked
        if len(recent) >= 2 * self.window:
            self._forget_old_ids()
        if moved is not None:
            self.phases[moved[0]] = moved[1]
        if seq >= self.next_anchor:
            self._check_anchors(seq, digest)

    def _plan_anchors(self) -> None:
        """The next seq with an anchor to check: the recorded head, the trusted checkpoint,
        the next checkpoint (at any seq: one below the chain's head is checked at once)."""
        due = [] if self.pending_cp is None else [self.pending_cp["seq"]]
        for anchor in (self.expected_head, self.trusted):
            if anchor is not None and anchor[0] > self.head_seq:
                due.append(anchor[0])
        self.next_anchor: float = min(due, default=math.inf)

    def _check_anchors(self, seq: int, digest: str) -> None:
        if self.expected_head is not None and seq == self.expected_head[0] and digest != self.expected_head[1]:
            raise _Stop(
                Finding(
                    FORK,
                    seq,
                    seq,
                    f"the chain at seq {seq} hashes to {digest}, but the run's recorded head is {self.expected_head[1]}",
                )
            )
        if self.trusted is not None and seq == self.trusted[0] and digest != self.trusted[1]:
            raise _Stop(
                Finding(
                    FORK,
                    seq,
                    seq,
                    f"the chain at seq {seq} hashes to {digest}, but the previously trusted checkpoint says "
                    f"{self.trusted[1]}; the histories diverge somewhere in {(self.trusted_cp or 0) + 1}..{seq}",
                )
            )
        self._check_checkpoints_at(seq, digest)
        self._plan_anchors()

    def finish(self) -> None:
        head = self.head_seq
        if self.expected_head is not None and head < self.expected_head[0]:
            last = self.expected_head[0]
            raise _Stop(
                Finding(GAP, head + 1, last, f"the chain ends at seq {head}, the run's recorded head is {last}")
            )
        # Checkpoints beyond the end of the chain: sealed evidence that is no longer there.
        rolled_back_to = None
        first_bad = None
        while self.pending_cp is not None:
            problem = self._mac_problem(self.pending_cp)
            if problem is None:
                rolled_back_to = self.pending_cp["seq"]
            elif first_bad is None:
                first_bad = (self.pending_cp["seq"], problem)
            self._next_checkpoint()
        if self.trusted is not None and head < self.trusted[0]:
            last = max(self.trusted[0], rolled_back_to or 0)
            raise _Stop(
                Finding(
                    ROLLBACK,
                    head + 1,
                    last,
                    f"the chain ends at seq {head}, before the previously trusted checkpoint at seq {self.trusted[0]}",
                )
            )
        if rolled_back_to is not None:
            raise _Stop(
                Finding(
                    ROLLBACK,
                    head + 1,
                    rolled_back_to,
                    f"the chain ends at seq {head}, but a valid checkpoint seals it up to seq {rolled_back_to}",
                )
            )
        if first_bad is not None:
            raise _Stop(Finding(CHECKPOINT_MISMATCH, first_bad[0], first_bad[0], first_bad[1]))

    def report(self, finding: Finding | None) -> Report:
        if finding is not None:
            status = BROKEN
        elif self.trusted_cp is not None and self.trusted_cp == self.head_seq:
            status = VERIFIED
        else:
            status = UNSEALED
        return Report(
            run_id=self.run_id,
            status=status,
            events_checked=self.checked,
            head_seq=self.head_seq,
            head_hash=self.head_hash,
            last_trusted_checkpoint=self.trusted_cp,
            finding=finding,
            event_macs=MACS_NOT_CHECKED if self.signers is None else MACS_CHECKED,
            unsigned_events=self.unsigned,
        )


def _pair(value: tuple[int, str] | None, name: str) -> tuple[int, str] | None:
    if value is None:
        return None
    try:
        seq, digest = value
    except (TypeError, ValueError):
        raise InputError(f"{name} must be (seq, hash)") from None
    if not _int(seq) or seq < 0 or not isinstance(digest, str):
        raise InputError(f"{name} must be (seq, hash) with an integer seq >= 0")
    return seq, digest


def verify_chain(
    run_id: str,
    events: Iterable[Mapping[str, Any]],
    checkpoints: Iterable[Mapping[str, Any]],
    keys: Mapping[str, bytes],
    *,
    expected_head: tuple[int, str] | None = None,
    trusted: tuple[int, str] | None = None,
    event_keys: Mapping[str, bytes] | None = None,
) -> Report:
    """Verify one run's chain, streaming, and report the first bad seq.

    ``events``: dicts with EVENT_KEYS in ascending seq order as stored. ``checkpoints``:
    dicts with CHECKPOINT_KEYS, ascending seq. ``keys``: checkpoint keys by id.
    ``expected_head``: (last_seq, last_hash) the store records for the run. ``trusted``:
    (seq, hash) of the checkpoint this verifier trusted at its previous run. ``event_keys``:
    event keys by id; None leaves the events' MACs unchecked (the report says so).

    Rules, checked per event in this order (the first that applies is the finding):

    * gap: the seq after the previous one is missing -> the missing range; a chain shorter
      than ``expected_head`` -> (end + 1, recorded head seq); a row that hashes only as
      seq + 1 (an event removed, later rows renumbered) -> (seq, seq).
    * reorder: rows seq and seq + 1 swapped (stored in the wrong order, or their seq values
      exchanged: the row links to the next row's hash, or each hashes only under the other's
      seq) -> (seq, seq + 1).
    * duplicate: a seq at or below the previous one, or an event_id equal to one of the
      previous DUPLICATE_WINDOW events -> the repeating row's seq.
    * fork: an event beyond ``expected_head`` -> (recorded head seq + 1); the chain hash at
      the recorded head seq, or at the ``trusted`` seq, differs from the recorded one.
    * mutated: a missing/mistyped field, an event of another run, or a hash that does not
      recompute -> (seq, seq).
    * prev_hash_mismatch: the hash recomputes but prev_hash is not the previous event's
      hash -> (seq, seq).
    * mac_missing / mac_unknown_key_id / mac_mismatch (only with ``event_keys``): the event
      is the linked event at its seq, but it has no MAC (allowed only for legacy events
      before the first signed one and at or below a checkpoint), or its mac_key_id is not
      among the event keys, or the MAC does not verify -> (seq, seq).
    * illegal_transition: an OPERATION_<PHASE> event whose phase is unknown, whose "to" is
      not <PHASE>, whose "from" is not the operation's last phase in this chain, or whose
      from -> to is not in PHASE_TRANSITIONS; OPERATION_PLANNED without "from" starts an
      operation and may not repeat one -> (seq, seq).
    * checkpoint_mismatch: a checkpoint of another run, of another verifier version, with an
      unknown key id, a MAC that does not verify, or a last_hash other than the recomputed
      chain hash at its seq -> (cp seq, cp seq).

    At the end of the stream: a chain shorter than ``expected_head`` is a gap; a chain
    ending before ``trusted`` or before a checkpoint whose MAC verifies is a rollback
    (end + 1, sealed seq); a checkpoint beyond the end whose MAC fails is a
    checkpoint_mismatch. Checkpoints missing while the chain still reaches the trusted seq
    with the trusted hash are no rollback: the events are intact and merely unsealed, so the
    run is UNSEALED (the verifier may seal it again).

    Raises InputError when the input is not a chain at all (an event without an integer
    seq, checkpoints out of order, malformed arguments).
    """
    verifier = _Verifier(run_id, checkpoints, keys, expected_head, trusted, event_keys)
    payloads = PayloadCheck()
    finding = None
    stream = payloads.watching(events)
    end = _End()
    current = next(stream, end)
    position = 1
    try:
        while not isinstance(current, _End):
            following = next(stream, end)
            verifier.step(current, None if isinstance(following, _End) else following, position)
            current = following
            position += 1
        verifier.finish()
    except _Stop as stop:
        finding = stop.finding
    return payloads.conclude(verifier.report(finding))


# --- payloads committed by digest ---------------------------------------------------------

# The event schema version whose fields commit to a payload kept beside the chain.
PAYLOAD_VERSION = 2
# The fields of a version-2 event that name its payload.
PAYLOAD_DIGEST = "payload_digest"
PAYLOAD_CLASS = "payload_class"
REMOVED_BY_RETENTION = "retention"
REMOVED_SEQS_SHOWN = 20
_ABSENT = object()


def payload_digest(payload: object) -> str:
    """What a version-2 event's fields commit to: the hash of the payload's canonical JSON."""
    return hash_bytes(canonical_json(payload))


def payload_reference(fields: object) -> str | None:
    """The digest a version-2 event's fields commit its payload to (None: they name none)."""
    digest = fields.get(PAYLOAD_DIGEST) if isinstance(fields, Mapping) else None
    return digest if isinstance(digest, str) and digest.startswith(HASH_PREFIX) else None


class PayloadCheck:
    """The payloads of a chain's version-2 events, seen one event at a time: each present
    payload must hash to the digest its event commits to; one removed by retention is
    counted, not a finding. The first problem becomes the report's finding when the chain
    itself holds up to its seq (``conclude``)."""

    def __init__(self) -> None:
        self.checked = self.removed = self.withheld = 0
        self.removed_seqs: list[int] = []
        self.finding: Finding | None = None

    def see(
        self, seq: int, fields: object, payload: object = _ABSENT, *, removed: object = None, withheld: bool = False
    ) -> None:
        """The version-2 event at ``seq`` with its ``fields``, and what is known of its
        payload: the payload itself, the marker of its removal, or that it is withheld."""
        if self.finding is not None:
            return
        digest = payload_reference(fields)
        if digest is None:
            self._problem(PAYLOAD_MISSING, seq, f"event {seq} is of schema version 2 but names no payload digest")
        elif payload is not _ABSENT:
            try:
                actual: str | None = payload_digest(payload)
            except (TypeError, ValueError):
                actual = None
            if actual != digest:
                detail = f"the payload of event {seq} does not hash to the digest {digest} its event commits to"
                self._problem(PAYLOAD_MISMATCH, seq, detail)
            self.checked += 1
        elif removed is not None:
            if not isinstance(removed, Mapping) or removed.get("by") != REMOVED_BY_RETENTION:
                self._problem(PAYLOAD_MISSING, seq, f"the payload of event {seq} was removed, but not by retention")
            self.removed += 1
            if len(self.removed_seqs) < REMOVED_SEQS_SHOWN:
                self.removed_seqs.append(seq)
        elif withheld:
            self.withheld += 1
        else:
            self._problem(PAYLOAD_MISSING, seq, f"the payload of event {seq} is gone and was not removed by retention")

    def _problem(self, reason: str, seq: int, detail: str) -> None:
        self.finding = Finding(reason, seq, seq, detail)

    def see_event(self, event: object) -> None:
        """An exported event: its payload, ``payload_removed`` or ``payload_withheld``
        beside its canonical fields (version-1 events are passed over)."""
        if not isinstance(event, Mapping) or event.get("schema_version") != PAYLOAD_VERSION:
            return
        seq = event.get("seq")
        if _int(seq):
            removed, withheld = event.get("payload_removed"), event.get("payload_withheld") is True
            self.see(seq, event.get("fields"), event.get("payload", _ABSENT), removed=removed, withheld=withheld)

    def watching(self, events: Iterable[Any]) -> Iterator[Any]:
        """``events`` as they are, each seen on its way through."""
        for event in events:
            self.see_event(event)
            yield event

    def conclude(self, report: Report) -> Report:
        """``report`` with the payloads' counts, and their first problem as its finding when
        the chain holds at that seq."""
        report.payloads_checked, report.payloads_removed = self.checked, self.removed
        report.payloads_removed_seqs, report.payloads_withheld = list(self.removed_seqs), self.withheld
        finding = self.finding
        if report.finding is None and finding is not None and finding.first_seq <= report.head_seq:
            report.finding, report.status = finding, BROKEN
        return report


# --- stored rows ----------------------------------------------------------------------------

# A stored event as a row: its canonical fields (run_id aside, the run's own), its hash and MAC.
ROW_COLUMNS = (
    "seq",
    "event_id",
    "type",
    "schema_version",
    "actor",
    "occurred_at",
    "fields",
    "prev_hash",
    "hash",
    "mac_key_id",
    "mac",
)
# What json.loads runs under its wrapper (which strips whitespace PostgreSQL never writes).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_QUOTED_MAX = 4096


def row_document(run_id: str, row: Sequence[Any]) -> dict[str, Any]:
    """The event a stored row stands for, as ``verify_chain`` reads it. ``row`` holds the
    ROW_COLUMNS with ``fields`` as JSON text; text that is not JSON is kept as it is (the
    event then fails the check of its fields' type)."""
    if len(row) != len(ROW_COLUMNS):
        raise InputError(f"a row must hold {len(ROW_COLUMNS)} columns: {', '.join(ROW_COLUMNS)}")
    event = dict(zip(ROW_COLUMNS, row, strict=True))
    event["run_id"] = run_id
    if isinstance(event["fields"], str):
        with contextlib.suppress(json.JSONDecodeError):
            event["fields"] = json.loads(event["fields"])
    return event


def verify_rows(
    run_id: str,
    batches: Iterable[Sequence[Sequence[Any]]],
    checkpoints: Iterable[Mapping[str, Any]],
    keys: Mapping[str, bytes],
    *,
    expected_head: tuple[int, str] | None = None,
    trusted: tuple[int, str] | None = None,
    event_keys: Mapping[str, bytes] | None = None,
    observe: Callable[[Sequence[Sequence[Any]]], None] | None = None,
) -> Report:
    """``verify_chain`` over a run's stored rows: the report ``verify_chain`` gives for the
    documents ``row_document(run_id, row)``, found with less work per event.

    ``batches``: lists of rows (ROW_COLUMNS, ``event_id`` and ``occurred_at`` already the
    strings of the canonical form, ``fields`` its JSON text), together in ascending seq
    order as stored: what a cursor's ``fetchmany`` returns, one list after another.

    A row that is the next link of the chain in every respect (the next seq, linked to the
    head, of the expected types, not a recent event id, hashing to its hash, its MAC
    verifying under a known key) has its canonical bytes written straight from its columns
    and is accepted as ``verify_chain`` accepts it, its anchors and transition checked by
    the same code. Any other row is made a document and goes through ``verify_chain``'s
    own rules, which name the finding: the short way never accepts what they refuse.

    ``observe``, if given, is called with the rows as ``verify_chain`` would have taken
    them in (it reads one event ahead): in order, every row up to the one after the first
    bad row (all of them when there is none), each batch once it has been checked. An
    exception it raises takes the place of the report (or of the exception that stopped
    the check) when ``verify_chain`` would have taken in that row before reaching the
    verdict."""
    verifier = _Verifier(run_id, checkpoints, keys, expected_head, trusted, event_keys)
    quoted_run = _json_string(run_id)
    canonical_tail = f',"run_id":{quoted_run},"schema_version":'
    signers = None
    if verifier.signers is not None:  # key id -> (signer, its MAC message after the hash)
        signers = {
            key_id: (signer, f',"key_id":{_json_string(key_id)},"run_id":{quoted_run},"seq":')
            for key_id, signer in verifier.signers.items()
        }
    limit = math.inf if verifier.expected_head is None else verifier.expected_head[0]
    recent, window = verifier.recent, verifier.window
    quoted: dict[str, str] = {}  # actor or type -> its JSON string
    sha256, scan, quote, compare = hashlib.sha256, _scan_json, _json_string, hmac.compare_digest
    step, transition, accept = verifier.step, verifier._transition, verifier._accept
    finding = None
    stream = iter(batches)
    batch = _next_batch(stream)
    position = 0  # of the row before the batch, counting from 1
    try:
        while batch:
            upcoming: Sequence[Sequence[Any]] | None = None  # the next batch, once a row needed its first row
            index = -1
            try:
                for index, current in enumerate(batch):
                    head_hash = verifier.head_hash
                    try:
                        seq, event_id, kind, version, actor, occurred, text, prev_hash, stored, key_id, mac = current
                        # The rules' order does not matter here: a row is either usual in every
                        # respect or left to them. A string column that is no string fails quote().
                        usual = (
                            type(seq) is int
                            and seq == verifier.head_seq + 1
                            and seq <= limit
                            and prev_hash == head_hash
                            and type(version) is int
                            and recent.get(event_id, _NEVER) <= verifier.checked - window
                        )
                        if usual:
                            fields, stop = scan(text, 0)
                            usual = stop == len(text) and type(fields) is dict
                        if usual:
                            quoted_actor, quoted_kind = quoted.get(actor), quoted.get(kind)  # a run has few of each
                            if quoted_actor is None or quoted_kind is None:
                                if len(quoted) > _QUOTED_MAX:
                                    quoted.clear()
                                quoted_actor = quoted[actor] = quote(actor)
                                quoted_kind = quoted[kind] = quote(kind)
                            # canonical_bytes, its keys in sorted order (head_hash is a hash: nothing to escape)
                            canonical = (
                                f'{{"actor":{quoted_actor},"event_id":{quote(event_id)},'
                                f'"fields":{_canonical_text(fields)},"occurred_at":{quote(occurred)},'
                                f'"prev_hash":"{head_hash}"{canonical_tail}{version},"seq":{seq},"type":{quoted_kind}}}'
                            )
                            digest = HASH_PREFIX + sha256(canonical.encode()).hexdigest()
                            usual = digest == stored
                        if usual and signers is not None:
                            signer, mac_tail = signers[key_id]
                            expected = signer.mac_of(f'{{"hash":"{digest}"{mac_tail}{seq}}}'.encode())
                            usual = type(mac) is str and compare(expected, mac)
                    except Exception:  # whatever is unusual about the row, the rules name it
                        usual = False
                    if usual:
                        if signers is not None:
                            verifier.signed_seen = True
                        moved = None
                        if kind.startswith(OPERATION_PREFIX):
                            moved = transition({"type": kind, "seq": seq, "fields": fields})
                        accept(seq, digest, event_id, moved)
                    else:
                        if index + 1 < len(batch):
                            following: Sequence[Any] | None = batch[index + 1]
                        else:
                            upcoming = _next_batch(stream) if upcoming is None else upcoming
                            following = upcoming[0] if upcoming else None
                        step(
                            row_document(run_id, current),
                            None if following is None else row_document(run_id, following),
                            position + index + 1,
                        )
            except Exception:
                if observe is not None:  # what verify_chain had read when it stopped
                    observe(batch[: index + 2])
                    if index + 1 >= len(batch):
                        upcoming = _next_batch(stream) if upcoming is None else upcoming
                        if upcoming:
                            observe(upcoming[:1])
                raise
            if observe is not None:
                observe(batch)
            position += len(batch)
            batch = _next_batch(stream) if upcoming is None else upcoming
        verifier.finish()
    except _Stop as stop:
        finding = stop.finding
    return verifier.report(finding)


def _next_batch(batches: Iterator[Sequence[Sequence[Any]]]) -> Sequence[Sequence[Any]]:
    """The next batch that holds a row; empty at the end."""
    for batch in batches:
        if batch:
            return batch
    return ()


# --- command line -------------------------------------------------------------------------

EXIT_CODES = {VERIFIED: 0, UNSEALED: 1, BROKEN: 2}
EXIT_BAD_INPUT = 3


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit 2, which means BROKEN here
        raise InputError(message)


def decode_key(text: object, key_id: str) -> bytes:
    if not isinstance(text, str):
        raise InputError(f"key {key_id!r} must be a string 'hex:...' or 'base64:...'")
    scheme, _, body = text.partition(":")
    try:
        if scheme == "hex":
            key = bytes.fromhex(body)
        elif scheme == "base64":
            key = base64.b64decode(body, validate=True)
        else:
            raise InputError(f"key {key_id!r} must start with 'hex:' or 'base64:'")
    except (ValueError, binascii.Error) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"key {key_id!r} is not valid {scheme}") from None
    if not key:
        raise InputError(f"key {key_id!r} is empty")
    return key


def _load_json(path: str, what: str) -> object:
    try:
        with open(path, "rb") as handle:
            return json.load(handle)
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {path} is not valid JSON: {exc}") from None


def load_keys(path: str) -> dict[str, bytes]:
    document = _load_json(path, "keys file")
    if not isinstance(document, dict):
        raise InputError("the keys file must be a JSON object {key_id: 'hex:...' | 'base64:...'}")
    return {key_id: decode_key(text, key_id) for key_id, text in document.items()}


def _parse_trusted(text: str | None) -> tuple[int, str] | None:
    if text is None:
        return None
    seq, sep, digest = text.partition(":")
    if not sep or not seq.isdigit() or not digest:
        raise InputError("--trusted must be SEQ:HASH, e.g. 10:sha256:...")
    return int(seq), digest


def run_cli(argv: list[str] | None = None) -> tuple[int, str]:
    """Returns (exit status, text to print)."""
    parser = _ArgumentParser(
        description="Verify an exported Fenceline evidence chain. Exit 0 VERIFIED, 1 UNSEALED, 2 BROKEN, 3 bad input.",
    )
    parser.add_argument("export", help="the export: {run_id, events, checkpoints?, head?}")
    parser.add_argument("--keys", required=True, help="JSON {key_id: 'hex:...' | 'base64:...'}")
    parser.add_argument(
        "--event-keys",
        help="JSON {key_id: 'hex:...' | 'base64:...'} of the event keys; without it MACs are not checked",
    )
    parser.add_argument("--trusted", help="SEQ:HASH of the checkpoint trusted at the previous verification")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    keys = load_keys(args.keys)
    event_keys = None if args.event_keys is None else load_keys(args.event_keys)
    trusted = _parse_trusted(args.trusted)
    document = _load_json(args.export, "export")
    if not isinstance(document, dict):
        raise InputError("the export must be a JSON object with run_id and events")
    run_id = document.get("run_id")
    events = document.get("events")
    checkpoints = document.get("checkpoints", [])
    if not isinstance(run_id, str) or not run_id:
        raise InputError("the export has no run_id")
    if not isinstance(events, list):
        raise InputError("the export has no events list")
    if not isinstance(checkpoints, list):
        raise InputError("the export's checkpoints must be a list")
    head = document.get("head")
    expected_head = None
    if head is not None:
        if not isinstance(head, dict) or not _int(head.get("last_seq")) or not isinstance(head.get("last_hash"), str):
            raise InputError("the export's head must be {last_seq: int, last_hash: str}")
        expected_head = (head["last_seq"], head["last_hash"])
    report = verify_chain(
        run_id, events, checkpoints, keys, expected_head=expected_head, trusted=trusted, event_keys=event_keys
    )
    text = json.dumps(report.to_dict(), indent=2, ensure_ascii=False) if args.json else report.summary()
    return EXIT_CODES[report.status], text


def main(argv: list[str] | None = None) -> int:
    try:
        status, text = run_cli(argv)
    except InputError as exc:
        message = " ".join(str(exc).split())
        print(f"evidence_verifier: bad input: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
