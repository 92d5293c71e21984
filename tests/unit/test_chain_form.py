"""The canonical form and hash are exact, so anyone can recompute them."""

import hashlib
import hmac
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from ledger.chain import (
    EVENT_COLUMNS,
    GENESIS_HASH,
    canonical_bytes,
    event_document,
    event_hash,
    event_mac,
    format_time,
    hash_bytes,
)
from ledger.models import Run
from ledger.services.evidence.append import build_event


def test_canonical_bytes_are_sorted_compact_utf8():
    data = canonical_bytes(
        run_id="r-1",
        seq=1,
        event_id="e-1",
        type="NOTE",
        schema_version=1,
        actor="worker:w/a",
        occurred_at="2026-12-02T10:00:00.000001Z",
        fields={"b": "ü", "a": [1, {"z": None, "y": True}]},
        prev_hash=GENESIS_HASH,
    )
    expected = (
        '{"actor":"worker:w/a","event_id":"e-1","fields":{"a":[1,{"y":true,"z":null}],"b":"ü"},'
        '"occurred_at":"2026-12-02T10:00:00.000001Z","prev_hash":"sha256:' + "0" * 64 + '",'
        '"run_id":"r-1","schema_version":1,"seq":1,"type":"NOTE"}'
    ).encode("utf-8")
    assert data == expected
    assert hash_bytes(data) == "sha256:" + hashlib.sha256(expected).hexdigest()


def test_occurred_at_is_utc_with_microseconds_and_z():
    moment = datetime(2026, 12, 2, 11, 0, 0, 5, tzinfo=timezone(timedelta(hours=1)))
    assert format_time(moment) == "2026-12-02T10:00:00.000005Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(datetime(2026, 12, 2))  # noqa: DTZ001 - the naive datetime is what is refused


def test_nan_cannot_enter_the_chain():
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical_bytes(
            run_id="r",
            seq=1,
            event_id="e",
            type="NOTE",
            schema_version=1,
            actor="a",
            occurred_at="t",
            fields={"x": float("nan")},
            prev_hash=GENESIS_HASH,
        )


def test_event_mac_is_hmac_sha256_of_the_canonical_run_seq_hash_and_key_id():
    key = b"an-event-key-of-at-least-16-bytes"
    digest = "sha256:" + "ab" * 32
    message = ('{"hash":"' + digest + '","key_id":"ek-1","run_id":"r-1","seq":7}').encode()
    assert event_mac(key, run_id="r-1", seq=7, hash=digest, key_id="ek-1") == (
        "hmac-sha256:" + hmac.new(key, message, hashlib.sha256).hexdigest()
    )


def test_build_event_signs_beside_the_hash_and_leaves_the_chain_form_unchanged(settings):
    key = b"an-event-key-of-at-least-16-bytes"
    settings.FENCELINE = {**settings.FENCELINE, "EVENT_KEYS": {"old": b"x" * 32, "ek-2": key}}
    settings.FENCELINE = {**settings.FENCELINE, "EVENT_SIGNING_KEY_ID": "ek-2"}
    run = Run(id=uuid.uuid4(), last_seq=4, last_hash="sha256:" + "cd" * 32)
    moment = datetime(2026, 12, 2, 10, 0, 0, 1, tzinfo=UTC)
    event = build_event(run, type="NOTE", actor="worker:w/a", fields={"b": "ü"}, occurred_at=moment)
    document = event_document(event)
    assert set(document) == {*EVENT_COLUMNS, "run_id"}
    expected = canonical_bytes(
        run_id=str(run.pk),
        seq=5,
        event_id=str(event.event_id),
        type="NOTE",
        schema_version=1,
        actor="worker:w/a",
        occurred_at="2026-12-02T10:00:00.000001Z",
        fields={"b": "ü"},
        prev_hash="sha256:" + "cd" * 32,
    )
    assert event.hash == hash_bytes(expected) == event_hash(document)  # the MAC is not hashed
    assert (event.mac_key_id, event.mac) == (
        "ek-2",
        event_mac(key, run_id=str(run.pk), seq=5, hash=event.hash, key_id="ek-2"),
    )
    # A new signing key id takes effect for the next event without a restart.
    settings.FENCELINE = {**settings.FENCELINE, "EVENT_SIGNING_KEY_ID": "old"}
    following = build_event(run, type="NOTE", actor="worker:w/a", fields={}, occurred_at=moment)
    assert following.mac_key_id == "old"
    assert following.mac == event_mac(b"x" * 32, run_id=str(run.pk), seq=6, hash=following.hash, key_id="old")
