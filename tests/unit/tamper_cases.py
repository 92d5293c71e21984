"""Every way of tampering with the reference chain the verifier must tell apart: each case
returns (events, checkpoints, verify's keyword arguments), and TAMPER_CASES maps it to the
finding it must get: (reason, first bad seq, last bad seq)."""

import copy

from fenceline_client import evidence_verifier as ev
from tests.unit.reference_chain import (
    CHAIN,
    CHECKPOINTS,
    HASH,
    HEAD,
    OP_B,
    RUN,
    SPECS,
    build,
    checkpoint,
    checkpoints_for,
    make_event,
    rechain,
    sign,
    without,
)


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


PAYLOAD = {"stderr": "timeout after 30 s", "attempt": 2}


def with_payload(**beside):
    """The reference chain with seq 13 an event of schema version 2 whose fields commit to
    PAYLOAD by its digest (re-hashed, re-linked and re-signed from there, checkpoints to
    match), exported with ``beside`` it: its payload, or the marker of its removal."""
    events = copy.deepcopy(CHAIN)
    event = events[12]
    event["schema_version"] = ev.PAYLOAD_VERSION
    event["fields"] = {
        **event["fields"],
        ev.PAYLOAD_DIGEST: ev.payload_digest(PAYLOAD),
        ev.PAYLOAD_CLASS: "event_payload",
    }
    events = rechain(events, 13)
    events[12].update(beside)
    return events, checkpoints_for(events), {}


def payload_rewritten():
    return with_payload(payload={**PAYLOAD, "attempt": 1})


def payload_gone_without_retention():
    return with_payload()


def payload_removed_by_someone_else():
    return with_payload(payload_removed={"by": "admin", "at": "2026-12-03T00:00:00.000000Z"})


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
# Tampering with a payload kept beside the chain: what an export says beside its events.
# Stored rows (verify_rows) hold no payload: the in-app verifier checks the payloads in a pass
# of its own (tests/ledger/evidence/test_data_planes.py).
PAYLOAD_TAMPER_CASES = {
    payload_rewritten: ("payload_mismatch", 13, 13),
    payload_gone_without_retention: ("payload_missing", 13, 13),
    payload_removed_by_someone_else: ("payload_missing", 13, 13),
}
EXPORT_TAMPER_CASES = {**TAMPER_CASES, **PAYLOAD_TAMPER_CASES}
