"""Event MACs beside the hash chain: HMAC-SHA256 over run, seq, hash and key id; a forged
append with a correct hash fails the MAC; rotated keys still verify; a report says when the
MACs were not checked; legacy events without one verify only before the signed ones."""

import copy

from fenceline_client import evidence_verifier as ev
from tests.unit.reference_chain import (
    CHAIN,
    E1,
    E2,
    HEAD,
    RUN,
    checkpoints_for,
    make_event,
    sign,
    verify,
)
from tests.unit.tamper_cases import forged_append_without_a_mac


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
