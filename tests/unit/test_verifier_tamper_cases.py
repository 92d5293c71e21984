"""The standalone evidence verifier classifies every tamper case (tests/unit/tamper_cases.py)
with its exact range, stops trusting at the first failure, and keeps its memory bounded."""

import copy
import tracemalloc

import pytest

from fenceline_client import evidence_verifier as ev
from tests.unit.reference_chain import (
    CHAIN,
    CHECKPOINTS,
    HASH,
    KEYS,
    OP_A,
    RUN,
    SPECS,
    build,
    checkpoints_for,
    make_event,
    verify,
)
from tests.unit.tamper_cases import (
    EXPORT_TAMPER_CASES as TAMPER_CASES,
)
from tests.unit.tamper_cases import (
    chain_continues_past_head,
    delete_run,
    duplicate_event_id_rehashed,
    fork_after_restore,
    head_hash_differs,
    unknown_key_id,
)


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
