"""The standalone evidence verifier: every tamper case is classified with its exact range.

Pure Python, no database: the chain is built in memory with the verifier's own functions.
"""

import ast
import copy
import json
import os
import subprocess
import sys
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

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


# --- the untampered chain ---------------------------------------------------------------


def test_untampered_chain_is_verified():
    report = verify(expected_head=(HEAD, HASH[HEAD]), trusted=(10, HASH[10]))
    assert report.status == ev.VERIFIED
    assert report.finding is None
    assert (report.events_checked, report.head_seq, report.head_hash) == (HEAD, HEAD, HASH[HEAD])
    assert report.last_trusted_checkpoint == HEAD
    assert report.to_dict()["finding"] is None
    assert report.to_dict()["status"] == "VERIFIED"


def test_the_events_can_be_a_generator():
    report = verify(events=(copy.deepcopy(e) for e in CHAIN), checkpoints=iter(CHECKPOINTS))
    assert report.status == ev.VERIFIED


def test_removing_the_final_checkpoint_leaves_it_unsealed():
    report = verify(checkpoints=CHECKPOINTS[:-1], expected_head=(HEAD, HASH[HEAD]))
    assert report.status == ev.UNSEALED
    assert report.finding is None
    assert report.last_trusted_checkpoint == 10
    assert report.head_seq == HEAD


def test_removed_checkpoints_with_the_events_intact_are_unsealed_not_rolled_back():
    # The verifier trusted seq 14 and the chain still reaches it with the same hash: the
    # evidence is intact but no longer sealed.
    events, checkpoints, kwargs = checkpoints_removed_events_intact()
    report = verify(events, checkpoints, **kwargs)
    assert (report.status, report.finding, report.last_trusted_checkpoint) == (ev.UNSEALED, None, 10)


def test_no_checkpoint_at_all_is_unsealed():
    report = verify(checkpoints=[])
    assert (report.status, report.last_trusted_checkpoint) == (ev.UNSEALED, None)


def test_key_rotation_old_checkpoints_still_verify():
    checkpoints = checkpoints_for(CHAIN, (5, 10), "k1") + checkpoints_for(CHAIN, (HEAD,), "k2")
    report = verify(checkpoints=checkpoints)
    assert report.status == ev.VERIFIED
    assert report.last_trusted_checkpoint == HEAD


def test_checkpoint_hash_matches_chain_form():
    assert ev.GENESIS_HASH == "sha256:" + "0" * 64
    assert CHAIN[0]["prev_hash"] == ev.GENESIS_HASH
    assert CHECKPOINTS[0]["mac"].startswith("hmac-sha256:") and len(CHECKPOINTS[0]["mac"]) == 12 + 64


def test_chain_module_reexports_the_single_definition():
    from ledger import chain

    for name in ("GENESIS_HASH", "HASH_PREFIX", "canonical_bytes", "format_time", "hash_bytes"):
        assert getattr(chain, name) is getattr(ev, name)


def test_phase_table_is_a_copy_of_the_ledger_states():
    from ledger.states import PHASE_TRANSITIONS

    assert {k.value: {p.value for p in v} for k, v in PHASE_TRANSITIONS.items()} == {
        k: set(v) for k, v in ev.PHASE_TRANSITIONS.items()
    }


# --- tamper cases: (events, checkpoints, kwargs) -> (reason, first_seq, last_seq) ----------


def swap_seq(events, k):
    """Rows k and k+1 exchange their seq values; read back ordered by seq."""
    events = copy.deepcopy(events)
    events[k - 1]["seq"], events[k]["seq"] = k + 1, k
    return sorted(events, key=lambda e: e["seq"])


def delete_one():
    return without(CHAIN, 7), None, {}


def delete_run():
    return without(CHAIN, 7, 8, 9), None, {}


def truncate_after_12():
    return without(CHAIN, 13, 14), None, {"expected_head": (HEAD, HASH[HEAD])}


def delete_and_renumber():
    events = without(CHAIN, 7)
    for e in events[6:]:
        e["seq"] -= 1
    return events, None, {}


def swap_rows_7_8():
    return swap_seq(CHAIN, 7), None, {}


def swap_stream_order_7_8():
    events = copy.deepcopy(CHAIN)
    events[6], events[7] = events[7], events[6]
    return events, None, {}


def duplicate_row():
    events = copy.deepcopy(CHAIN)
    events.insert(8, copy.deepcopy(CHAIN[7]))  # event 8 stored twice
    return events, None, {}


def duplicate_event_id_rehashed():
    # A copy of NOTE event 8 appended as seq 15, hashed and linked correctly.
    events = copy.deepcopy(CHAIN)
    events.append(make_event(15, "NOTE", {"text": "about to send ü"}, HASH[HEAD], event_id=CHAIN[7]["event_id"]))
    return events, checkpoints_for(CHAIN, (5, 10)), {}


def mutate_field():
    events = copy.deepcopy(CHAIN)
    events[5]["fields"]["resource"] = "smtp:everyone"
    return events, None, {}


def mutate_actor():
    events = copy.deepcopy(CHAIN)
    events[10]["actor"] = "system:lease-reaper"
    return events, None, {}


def relink_prev_hash():
    events = copy.deepcopy(CHAIN)
    events[8]["prev_hash"] = HASH[7]  # skips event 8, but re-hashed so the hash recomputes
    events[8]["hash"] = ev.event_hash(events[8])
    sign(events[8])
    return events, None, {}


def fake_confirmation_from_unknown():
    # After OPERATION_UNKNOWN (seq 11) insert a confirmation, then re-chain everything.
    events = copy.deepcopy(CHAIN)
    fake = make_event(
        12,
        "OPERATION_CONFIRMED",
        {"operation_id": OP_B, "from": "UNKNOWN", "to": "CONFIRMED", "attempt": 1, "provider_request_id": "msg-1"},
        HASH[11],
    )
    events.insert(11, fake)
    return rechain(events, 12), checkpoints_for(CHAIN, (5, 10)), {}


def fake_confirmation_stale_from():
    events = copy.deepcopy(CHAIN)
    fake = make_event(
        12,
        "OPERATION_CONFIRMED",
        {"operation_id": OP_B, "from": "DISPATCHED", "to": "CONFIRMED", "attempt": 1},
        HASH[11],
    )
    events.insert(11, fake)
    return rechain(events, 12), checkpoints_for(CHAIN, (5, 10)), {}


def dispatch_before_authorize():
    specs = copy.deepcopy(SPECS)
    specs[6], specs[8] = specs[8], specs[6]  # B: DISPATCHED (from AUTHORIZED) at 7, AUTHORIZED at 9
    events = build(specs)
    return events, checkpoints_for(events, (5,)), {}


def planned_twice():
    specs = copy.deepcopy(SPECS)
    specs.insert(6, copy.deepcopy(SPECS[5]))
    events = build(specs)
    return events, checkpoints_for(events, (5,)), {}


def transition_of_unplanned_operation():
    specs = copy.deepcopy(SPECS)
    specs[7] = ("OPERATION_AUTHORIZED", {"operation_id": "never-planned", "from": "PLANNED", "to": "AUTHORIZED"})
    events = build(specs)
    return events, checkpoints_for(events, (5,)), {}


def bad_checkpoint_mac():
    checkpoints = copy.deepcopy(CHECKPOINTS)
    checkpoints[1]["mac"] = ev.checkpoint_mac(
        b"wrong key", run_id=RUN, seq=10, last_hash=HASH[10], verifier_version="1", key_id="k1"
    )
    return None, checkpoints, {}


def unknown_key_id():
    checkpoints = copy.deepcopy(CHECKPOINTS)
    checkpoints[1] = checkpoint(10, HASH[10], "k9", key=b"some other key")
    return None, checkpoints, {}


def rewritten_and_rehashed():
    # Event 8 changed and everything from it re-hashed: only the checkpoint at 10 knows.
    events = copy.deepcopy(CHAIN)
    events[7]["fields"]["text"] = "nothing to see"
    return rechain(events, 8), None, {}


def checkpoint_for_other_hash():
    checkpoints = copy.deepcopy(CHECKPOINTS)
    checkpoints[1] = checkpoint(10, HASH[9])
    return None, checkpoints, {}


def rollback_restored_events():
    # An older backup of the events (and the run head) restored; the verifier trusted 14.
    return (
        without(CHAIN, 13, 14),
        checkpoints_for(CHAIN, (5, 10)),
        {
            "expected_head": (12, HASH[12]),
            "trusted": (HEAD, HASH[HEAD]),
        },
    )


def rollback_below_a_checkpoint():
    # Events and head restored from a backup, the checkpoint store still has seq 14.
    return without(CHAIN, 13, 14), None, {"expected_head": (12, HASH[12])}


def checkpoints_removed_events_intact():
    return None, checkpoints_for(CHAIN, (5, 10)), {"trusted": (HEAD, HASH[HEAD])}


def fork_after_restore():
    # Restored to seq 7, then the app went on writing other events and sealing them.
    specs = copy.deepcopy(SPECS)
    specs[7] = ("NOTE", {"text": "a different history"})
    events = build(specs)
    return events, checkpoints_for(events), {"trusted": (10, HASH[10])}


def chain_continues_past_head():
    return None, None, {"expected_head": (12, HASH[12])}


def head_hash_differs():
    return None, None, {"expected_head": (HEAD, HASH[13])}


def foreign_event():
    events = copy.deepcopy(CHAIN)
    events[3]["run_id"] = "another-run"
    events[3]["hash"] = ev.event_hash(events[3])
    sign(events[3])
    return events, None, {}


def forged_append_without_a_mac():
    # Hashed and linked exactly as Fenceline would, after the last checkpoint, by someone
    # without the event key.
    events = copy.deepcopy(CHAIN)
    events.append(make_event(15, "NOTE", {"text": "all fine"}, HASH[HEAD], key_id=None))
    return events, None, {}


def rewritten_and_rehashed_without_the_event_key():
    # As rewritten_and_rehashed, by someone without the event key: the MACs are stale.
    events = copy.deepcopy(CHAIN)
    events[7]["fields"]["text"] = "nothing to see"
    return rechain(events, 8, key_id=None), None, {}


def event_under_an_unknown_key_id():
    events = copy.deepcopy(CHAIN)
    sign(events[7], "e9", key=b"a key the verifier was not given")
    return events, None, {}


def mac_stripped_from_a_signed_chain():
    events = copy.deepcopy(CHAIN)
    sign(events[8], None)
    return events, None, {}


TAMPER_CASES = {
    delete_one: ("gap", 7, 7),
    delete_run: ("gap", 7, 9),
    truncate_after_12: ("gap", 13, 14),
    delete_and_renumber: ("gap", 7, 7),
    swap_rows_7_8: ("reorder", 7, 8),
    swap_stream_order_7_8: ("reorder", 7, 8),
    duplicate_row: ("duplicate", 8, 8),
    duplicate_event_id_rehashed: ("duplicate", 15, 15),
    mutate_field: ("mutated", 6, 6),
    mutate_actor: ("mutated", 11, 11),
    foreign_event: ("mutated", 4, 4),
    relink_prev_hash: ("prev_hash_mismatch", 9, 9),
    fake_confirmation_from_unknown: ("illegal_transition", 12, 12),
    fake_confirmation_stale_from: ("illegal_transition", 12, 12),
    dispatch_before_authorize: ("illegal_transition", 7, 7),
    planned_twice: ("illegal_transition", 7, 7),
    transition_of_unplanned_operation: ("illegal_transition", 8, 8),
    bad_checkpoint_mac: ("checkpoint_mismatch", 10, 10),
    unknown_key_id: ("checkpoint_mismatch", 10, 10),
    rewritten_and_rehashed: ("checkpoint_mismatch", 10, 10),
    checkpoint_for_other_hash: ("checkpoint_mismatch", 10, 10),
    rollback_restored_events: ("rollback", 13, 14),
    rollback_below_a_checkpoint: ("rollback", 13, 14),
    fork_after_restore: ("fork", 10, 10),
    chain_continues_past_head: ("fork", 13, 13),
    head_hash_differs: ("fork", 14, 14),
    forged_append_without_a_mac: ("mac_missing", 15, 15),
    mac_stripped_from_a_signed_chain: ("mac_missing", 9, 9),
    event_under_an_unknown_key_id: ("mac_unknown_key_id", 8, 8),
    rewritten_and_rehashed_without_the_event_key: ("mac_mismatch", 8, 8),
}


@pytest.mark.parametrize("tamper", list(TAMPER_CASES), ids=lambda f: f.__name__)
def test_tamper_is_classified_with_its_exact_range(tamper):
    events, checkpoints, kwargs = tamper()
    report = verify(events, checkpoints, **kwargs)
    reason, first, last = TAMPER_CASES[tamper]
    assert report.status == ev.BROKEN, report.summary()
    assert report.finding is not None
    assert (report.finding.reason, report.finding.first_seq, report.finding.last_seq) == (reason, first, last), (
        report.summary()
    )
    assert report.finding.reason in ev.REASONS


def test_every_reason_has_a_tamper_case():
    assert {reason for reason, _, _ in TAMPER_CASES.values()} == set(ev.REASONS)


@pytest.mark.parametrize("tamper", list(TAMPER_CASES), ids=lambda f: f.__name__)
def test_nothing_tampered_is_verified_even_without_the_extra_anchors(tamper):
    events, checkpoints, kwargs = tamper()
    report = verify(events, checkpoints, **kwargs)
    assert report.status != ev.VERIFIED
    report = verify(events, checkpoints)  # without expected_head and trusted
    if report.status == ev.VERIFIED:
        # Only the store's head or the verifier's memory can tell these apart from a clean chain.
        assert tamper in (chain_continues_past_head, head_hash_differs, fork_after_restore)


def test_last_trusted_checkpoint_stops_at_the_failure():
    events, checkpoints, _ = delete_run()
    report = verify(events, checkpoints)
    assert report.last_trusted_checkpoint == 5
    assert (report.events_checked, report.head_seq, report.head_hash) == (6, 6, HASH[6])
    events, checkpoints, _kwargs = unknown_key_id()
    assert verify(events, checkpoints).last_trusted_checkpoint == 5


def test_first_bad_seq_wins_over_later_damage():
    events = copy.deepcopy(CHAIN)
    events[9]["fields"]["fencing_token"] = 99  # mutated at 10
    del events[3]  # gap at 4
    report = verify(events)
    assert (report.finding.reason, report.finding.first_seq) == ("gap", 4)


def test_duplicate_event_id_is_found_only_within_the_window(monkeypatch):
    monkeypatch.setattr(ev, "DUPLICATE_WINDOW", 3)
    events, checkpoints, _ = duplicate_event_id_rehashed()  # repeats seq 8 at seq 15: 7 events apart
    assert verify(events, checkpoints).status == ev.UNSEALED
    monkeypatch.setattr(ev, "DUPLICATE_WINDOW", 7)
    assert verify(events, checkpoints).finding.reason == "duplicate"


def test_retry_after_failure_is_a_legal_replanning():
    specs = [
        *copy.deepcopy(SPECS[:4]),
        ("OPERATION_FAILED", {"operation_id": OP_A, "from": "DISPATCHED", "to": "FAILED", "attempt": 1}),
        ("OPERATION_PLANNED", {"operation_id": OP_A, "from": "FAILED", "to": "PLANNED", "attempt": 2}),
        ("OPERATION_AUTHORIZED", {"operation_id": OP_A, "from": "PLANNED", "to": "AUTHORIZED", "attempt": 2}),
    ]
    events = build(specs)
    assert verify(events, checkpoints_for(events, (len(specs),))).status == ev.VERIFIED


def test_not_a_chain_raises_input_error():
    with pytest.raises(ev.InputError):
        verify(events=[{"seq": "1"}])
    with pytest.raises(ev.InputError):
        verify(checkpoints=list(reversed(CHECKPOINTS)))


def test_memory_stays_bounded_over_a_long_chain():
    def long_chain(n):
        prev = ev.GENESIS_HASH
        for seq in range(1, n + 1):
            event = make_event(seq, "NOTE", {"i": seq}, prev)
            prev = event["hash"]
            yield event

    def peak(n):
        tracemalloc.start()
        try:
            report = ev.verify_chain(RUN, long_chain(n), [], KEYS)
            return report, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small_report, small = peak(1_500)
    large_report, large = peak(6_000)
    assert (small_report.status, large_report.head_seq) == (ev.UNSEALED, 6_000)
    assert large < small * 1.5 + 64 * 1024  # 4x the events, about the same memory


# --- event MACs -----------------------------------------------------------------------------


def test_event_mac_is_hmac_sha256_over_the_canonical_json_of_run_seq_hash_and_key_id():
    event = CHAIN[0]
    message = f'{{"hash":"{event["hash"]}","key_id":"e1","run_id":"{RUN}","seq":1}}'.encode()
    assert ev.event_mac_message(run_id=RUN, seq=1, hash=event["hash"], key_id="e1") == message
    assert event["mac"] == "hmac-sha256:" + __import__("hmac").new(E1, message, "sha256").hexdigest()
    assert ev.EventSigner("e1", E1).mac(run_id=RUN, seq=1, hash=event["hash"]) == event["mac"]


def test_the_mac_sits_beside_the_chain_and_does_not_change_the_hash():
    unsigned = make_event(3, "NOTE", {"n": 1}, ev.GENESIS_HASH, key_id=None)
    signed = make_event(3, "NOTE", {"n": 1}, ev.GENESIS_HASH, key_id="e2")
    assert unsigned["hash"] == signed["hash"] == ev.event_hash(signed)


def test_a_forged_append_with_a_correct_hash_passes_the_chain_and_fails_the_mac():
    events, checkpoints, _ = forged_append_without_a_mac()
    assert verify(events, checkpoints, event_keys=None).finding is None  # what the hash chain alone says
    report = verify(events, checkpoints)
    assert (report.finding.reason, report.finding.first_seq) == ("mac_missing", 15)
    assert (report.events_checked, report.last_trusted_checkpoint) == (HEAD, HEAD)


def test_a_mac_under_the_right_key_id_but_a_wrong_key_is_a_mismatch():
    events = copy.deepcopy(CHAIN)
    sign(events[11], "e1", key=b"a guessed key, not the event key")
    finding = verify(events).finding
    assert (finding.reason, finding.first_seq, finding.last_seq) == ("mac_mismatch", 12, 12)
    assert "key id 'e1'" in finding.detail


def test_events_signed_before_a_key_rotation_still_verify():
    events = copy.deepcopy(CHAIN)
    for event in events[7:]:
        sign(event, "e2")  # the signing key moved from e1 to e2 at seq 8
    assert verify(events).status == ev.VERIFIED
    finding = verify(events, event_keys={"e2": E2}).finding  # the old key dropped too early
    assert (finding.reason, finding.first_seq) == ("mac_unknown_key_id", 1)


def test_without_event_keys_the_report_says_the_macs_were_not_checked():
    report = verify(event_keys=None)
    assert (report.status, report.event_macs) == (ev.VERIFIED, ev.MACS_NOT_CHECKED)
    assert report.summary().splitlines()[0] == f"run {RUN}: VERIFIED (event MACs NOT checked: no event keys given)"
    assert report.to_dict()["event_macs"] == "not_checked"
    report = verify()
    assert (report.status, report.event_macs, report.unsigned_events) == (ev.VERIFIED, ev.MACS_CHECKED, 0)
    assert "event MACs: checked (14 verified)" in report.summary()


def test_legacy_events_without_a_mac_verify_only_before_the_signed_ones_and_under_a_checkpoint():
    events = copy.deepcopy(CHAIN)
    for event in events[:10]:
        sign(event, None)  # written before MACs existed, sealed by the checkpoint at seq 10
    report = verify(events)
    assert (report.status, report.unsigned_events) == (ev.VERIFIED, 10)
    assert "10 legacy events without one" in report.summary()
    for event in events[10:12]:
        sign(event, None)  # 11..12 unsigned too, but no checkpoint covers them
    report = verify(events, checkpoints_for(CHAIN, (5, 10)))
    assert (report.finding.reason, report.finding.first_seq) == ("mac_missing", 11)
    assert "no checkpoint covers it" in report.finding.detail


# --- the module is standard library only --------------------------------------------------


def test_module_imports_only_the_standard_library():
    tree = ast.parse(MODULE_PATH.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module.split(".")[0])
    assert imported, "the parse found the imports"
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


# --- command line ---------------------------------------------------------------------------


def run_cli(tmp_path, export: dict, *args, keys=None, event_keys=None) -> subprocess.CompletedProcess:
    export_path = tmp_path / "export.json"
    export_path.write_text(json.dumps(export, ensure_ascii=False), encoding="utf-8")
    keys_path = tmp_path / "keys.json"
    keys = keys or {"k1": "hex:" + K1.hex(), "k2": "base64:" + __import__("base64").b64encode(K2).decode()}
    keys_path.write_text(json.dumps(keys), encoding="utf-8")
    if event_keys is not None:
        (tmp_path / "event-keys.json").write_text(json.dumps(event_keys), encoding="utf-8")
        args = ("--event-keys", str(tmp_path / "event-keys.json"), *args)
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, str(MODULE_PATH), str(export_path), "--keys", str(keys_path), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def export_of(events=None, checkpoints=None, head=(HEAD, HASH[HEAD])) -> dict:
    document = {
        "run_id": RUN,
        "events": CHAIN if events is None else events,
        "checkpoints": CHECKPOINTS if checkpoints is None else checkpoints,
    }
    if head is not None:
        document["head"] = {"last_seq": head[0], "last_hash": head[1]}
    return document


def test_cli_verified_unsealed_broken_and_bad_input(tmp_path):
    done = run_cli(tmp_path, export_of())
    assert done.returncode == 0, done.stderr
    assert f"run {RUN}: VERIFIED" in done.stdout
    assert "last trusted checkpoint: seq 14" in done.stdout

    done = run_cli(tmp_path, export_of(checkpoints=CHECKPOINTS[:-1]))
    assert done.returncode == 1, done.stderr
    assert "UNSEALED" in done.stdout and "last trusted checkpoint: seq 10" in done.stdout
    assert "seq 11..14" in done.stdout

    done = run_cli(tmp_path, export_of(events=without(CHAIN, 7, 8)))
    assert done.returncode == 2, done.stderr
    assert "BROKEN" in done.stdout
    assert "first bad seq: 7 (range 7..8), reason: gap" in done.stdout
    assert "last trusted checkpoint: seq 5" in done.stdout

    done = run_cli(tmp_path, export_of(events=swap_seq(CHAIN, 7)), "--json")
    assert done.returncode == 2
    report = json.loads(done.stdout)
    assert report["status"] == "BROKEN"
    assert report["finding"]["reason"] == "reorder"
    assert (report["finding"]["first_seq"], report["finding"]["last_seq"]) == (7, 8)
    assert report["last_trusted_checkpoint"] == 5

    done = run_cli(tmp_path, export_of(head=None), "--trusted", f"10:{HASH[9]}")
    assert done.returncode == 2
    assert "range 10..10), reason: fork" in done.stdout

    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(MODULE_PATH), "broken.json", "--keys", "keys.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "not valid JSON" in done.stderr

    done = run_cli(tmp_path, export_of(), keys={"k1": "plain"})
    assert done.returncode == 3
    assert "must start with 'hex:' or 'base64:'" in done.stderr

    done = run_cli(tmp_path, export_of(), "--bogus-flag")
    assert done.returncode == 3
    assert len(done.stderr.strip().splitlines()) == 1


def test_cli_does_not_need_django_or_the_project(tmp_path):
    # Copy the file alone to a clean directory and run it there, isolated (-I).
    lonely = tmp_path / "evidence_verifier.py"
    lonely.write_text(MODULE_PATH.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "export.json").write_text(json.dumps(export_of()), encoding="utf-8")
    (tmp_path / "keys.json").write_text(json.dumps({"k1": "hex:" + K1.hex()}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(lonely), "export.json", "--keys", "keys.json", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "VERIFIED"


def test_cli_checks_the_event_macs_with_event_keys_and_says_when_it_did_not(tmp_path):
    event_keys = {"e1": "hex:" + E1.hex(), "e2": "base64:" + __import__("base64").b64encode(E2).decode()}
    done = run_cli(tmp_path, export_of(), event_keys=event_keys)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"run {RUN}: VERIFIED"
    assert "event MACs: checked (14 verified)" in done.stdout

    done = run_cli(tmp_path, export_of())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"run {RUN}: VERIFIED (event MACs NOT checked: no event keys given)"
    assert "event MACs: not checked (pass --event-keys to check them)" in done.stdout

    forged, _, _ = forged_append_without_a_mac()
    head = (15, forged[-1]["hash"])
    done = run_cli(tmp_path, export_of(events=forged, head=head), "--json", event_keys=event_keys)
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["event_macs"]) == ("BROKEN", "checked")
    assert (report["finding"]["reason"], report["finding"]["first_seq"]) == ("mac_missing", 15)

    done = run_cli(tmp_path, export_of(events=forged, head=head), "--json")  # no event keys: only unsealed
    assert done.returncode == 1, done.stderr
    assert (json.loads(done.stdout)["status"], json.loads(done.stdout)["event_macs"]) == ("UNSEALED", "not_checked")

    unknown, _, _ = event_under_an_unknown_key_id()
    done = run_cli(tmp_path, export_of(events=unknown), event_keys=event_keys)
    assert done.returncode == 2
    assert "first bad seq: 8 (range 8..8), reason: mac_unknown_key_id" in done.stdout

    done = run_cli(tmp_path, export_of(), event_keys={"e1": "plain"})
    assert done.returncode == 3
    assert "must start with 'hex:' or 'base64:'" in done.stderr
