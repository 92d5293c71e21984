"""The reference chain of the standalone verifier's tests: fourteen events of one run,
hashed, linked and signed as Fenceline does it, with checkpoints at seq 5, 10 and 14, built
in memory with the verifier's own functions (fenceline_client/evidence_verifier.py), and
the verifier called on it. Pure Python, no database."""

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fenceline_client import evidence_verifier as ev

MODULE_PATH = Path(ev.__file__).resolve()
RUN = "3f1c2a7e-0000-4000-8000-000000000001"
OP_A = "0b7a4a1e-0000-4000-8000-00000000000a"
OP_B = "0b7a4a1e-0000-4000-8000-00000000000b"
K1 = b"k1-secret-key-of-32-bytes-000000"
K2 = b"k2-secret-key-of-32-bytes-111111"
KEYS = {"k1": K1, "k2": K2}
E1 = b"e1-event-key-of-32-bytes-0000000"
E2 = b"e2-event-key-of-32-bytes-2222222"
EVENT_KEYS = {"e1": E1, "e2": E2}
T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
ACTOR = "worker:w1/owner-a"

# (type, fields) of the reference chain, seq 1..14
SPECS = [
    (
        "LEASE_ACQUIRED",
        {"owner_id": "owner-a", "fencing_token": 1, "previous_token": 0, "expires_at": "2026-12-02T10:05:00.000000Z"},
    ),
    (
        "OPERATION_PLANNED",
        {
            "operation_id": OP_A,
            "to": "PLANNED",
            "attempt": 1,
            "tool": "github",
            "action": "create_issue",
            "resource": "repo:acme/api",
            "effect_class": "IDEMPOTENT",
            "idempotency_key": "ik-a",
            "args_digest": "",
            "fencing_token": 1,
        },
    ),
    (
        "OPERATION_AUTHORIZED",
        {
            "operation_id": OP_A,
            "from": "PLANNED",
            "to": "AUTHORIZED",
            "attempt": 1,
            "reason": "placeholder policy: allow",
        },
    ),
    (
        "OPERATION_DISPATCHED",
        {"operation_id": OP_A, "from": "AUTHORIZED", "to": "DISPATCHED", "attempt": 1, "dispatch_token": 1},
    ),
    (
        "OPERATION_CONFIRMED",
        {
            "operation_id": OP_A,
            "from": "DISPATCHED",
            "to": "CONFIRMED",
            "attempt": 1,
            "provider_request_id": "issue_123",
        },
    ),
    (
        "OPERATION_PLANNED",
        {
            "operation_id": OP_B,
            "to": "PLANNED",
            "attempt": 1,
            "tool": "mail",
            "action": "send",
            "resource": "smtp:ops",
            "effect_class": "NON_RETRYABLE",
            "idempotency_key": "ik-b",
            "args_digest": "sha256:ab",
            "fencing_token": 1,
        },
    ),
    (
        "OPERATION_AUTHORIZED",
        {
            "operation_id": OP_B,
            "from": "PLANNED",
            "to": "AUTHORIZED",
            "attempt": 1,
            "reason": "placeholder policy: allow",
        },
    ),
    ("NOTE", {"text": "about to send ü"}),
    (
        "OPERATION_DISPATCHED",
        {"operation_id": OP_B, "from": "AUTHORIZED", "to": "DISPATCHED", "attempt": 1, "dispatch_token": 1},
    ),
    ("LEASE_EXPIRED", {"owner_id": "owner-a", "fencing_token": 1}),
    (
        "OPERATION_UNKNOWN",
        {
            "operation_id": OP_B,
            "from": "DISPATCHED",
            "to": "UNKNOWN",
            "attempt": 1,
            "reason": "LEASE_LOST",
            "case_id": 7,
        },
    ),
    (
        "LEASE_ACQUIRED",
        {"owner_id": "owner-b", "fencing_token": 2, "previous_token": 1, "expires_at": "2026-12-02T10:10:00.000000Z"},
    ),
    ("NOTE", {"text": "taking over"}),
    ("x.step", {"n": 3}),
]
HEAD = len(SPECS)


def make_event(
    seq: int, type: str, fields: dict, prev_hash: str, *, event_id: str | None = None, key_id: str | None = "e1"
) -> dict:
    """An event hashed and linked as Fenceline does, signed under ``key_id`` (None: no MAC)."""
    event = {
        "run_id": RUN,
        "seq": seq,
        "event_id": event_id or f"e0000000-0000-4000-8000-{seq:012d}",
        "type": type,
        "schema_version": 1,
        "actor": ACTOR,
        "occurred_at": ev.format_time(T0 + timedelta(seconds=seq, microseconds=seq)),
        "fields": fields,
        "prev_hash": prev_hash,
    }
    event["hash"] = ev.event_hash(event)
    return sign(event, key_id)


def sign(event: dict, key_id: str | None = "e1", key: bytes | None = None) -> dict:
    if key_id is None:
        event["mac_key_id"] = event["mac"] = ""
        return event
    key = EVENT_KEYS[key_id] if key is None else key
    event["mac_key_id"] = key_id
    event["mac"] = ev.event_mac(key, run_id=event["run_id"], seq=event["seq"], hash=event["hash"], key_id=key_id)
    return event


def build(specs=SPECS) -> list[dict]:
    events, prev = [], ev.GENESIS_HASH
    for seq, (type, fields) in enumerate(specs, start=1):
        event = make_event(seq, type, copy.deepcopy(fields), prev)
        events.append(event)
        prev = event["hash"]
    return events


def rechain(events: list[dict], start: int = 1, *, key_id: str | None = "e1") -> list[dict]:
    """Renumber from ``start`` and re-hash/re-link everything: a consistent forgery, re-signed
    under ``key_id`` (by someone holding the event key) or, with None, left with the MACs the
    events had (by someone without it)."""
    events = copy.deepcopy(events)
    prev = ev.GENESIS_HASH if start == 1 else events[start - 2]["hash"]
    for index in range(start - 1, len(events)):
        event = events[index]
        event["seq"] = index + 1
        event["prev_hash"] = prev
        event["hash"] = ev.event_hash(event)
        if key_id is not None:
            sign(event, key_id)
        prev = event["hash"]
    return events


def checkpoint(seq: int, last_hash: str, key_id: str = "k1", key: bytes | None = None) -> dict:
    key = KEYS[key_id] if key is None else key
    return {
        "run_id": RUN,
        "seq": seq,
        "last_hash": last_hash,
        "verifier_version": ev.VERIFIER_VERSION,
        "key_id": key_id,
        "mac": ev.checkpoint_mac(
            key, run_id=RUN, seq=seq, last_hash=last_hash, verifier_version=ev.VERIFIER_VERSION, key_id=key_id
        ),
    }


def checkpoints_for(events, seqs=(5, 10, HEAD), key_id="k1") -> list[dict]:
    by_seq = {e["seq"]: e["hash"] for e in events}
    return [checkpoint(s, by_seq[s], key_id) for s in seqs]


CHAIN = build()
HASH = {e["seq"]: e["hash"] for e in CHAIN}
CHECKPOINTS = checkpoints_for(CHAIN)


def verify(events=None, checkpoints=None, keys=KEYS, **kwargs) -> ev.Report:
    kwargs.setdefault("event_keys", EVENT_KEYS)
    return ev.verify_chain(
        RUN,
        CHAIN if events is None else events,
        CHECKPOINTS if checkpoints is None else checkpoints,
        keys,
        **kwargs,
    )


def without(events, *seqs):
    return [copy.deepcopy(e) for e in events if e["seq"] not in seqs]


def export_of(events=None, checkpoints=None, head=(HEAD, HASH[HEAD])) -> dict:
    document = {
        "run_id": RUN,
        "events": CHAIN if events is None else events,
        "checkpoints": CHECKPOINTS if checkpoints is None else checkpoints,
    }
    if head is not None:
        document["head"] = {"last_seq": head[0], "last_hash": head[1]}
    return document
