"""The standalone evidence verifier on the untampered reference chain: VERIFIED, or UNSEALED
when checkpoints are missing; keys rotate; the chain's form and phase table are the ledger's
own definitions (tests/unit/reference_chain.py)."""

import copy

from fenceline_client import evidence_verifier as ev
from tests.unit.reference_chain import (
    CHAIN,
    CHECKPOINTS,
    HASH,
    HEAD,
    checkpoints_for,
    verify,
)
from tests.unit.tamper_cases import checkpoints_removed_events_intact


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
