"""The canonical form and hash are exact, so anyone can recompute them."""

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from ledger.chain import GENESIS_HASH, canonical_bytes, format_time, hash_bytes


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
        format_time(datetime(2026, 12, 2))


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
