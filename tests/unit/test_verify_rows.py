"""The verifier over stored rows (``verify_rows``): the same report as ``verify_chain`` over
the documents the rows stand for, for every tamper case, whatever the batches; and it takes
in the rows as ``verify_chain`` does, so that what the in-app verifier learns on the way
(and an exception it raises) is the same.

Pure Python, no database: the rows are made from the reference chain
(tests/unit/reference_chain.py) and its tamper cases (tests/unit/tamper_cases.py).
"""

import copy
import hashlib
import hmac
import json

import pytest

from fenceline_client import evidence_verifier as ev
from tests.unit.reference_chain import (
    CHAIN,
    CHECKPOINTS,
    EVENT_KEYS,
    HASH,
    HEAD,
    KEYS,
    RUN,
    build,
    checkpoints_for,
    make_event,
)
from tests.unit.tamper_cases import TAMPER_CASES

BATCH_SIZES = (1, 2, 3, 5, 1000)


class Row(tuple):
    """A row that remembers where it stands in the stream."""

    at: int


def rows_of(events: list[dict] | None, text=json.dumps) -> list[Row]:
    """The rows a store holds for ``events`` (None: the reference chain), fields as JSON text."""
    rows = []
    events = CHAIN if events is None else events
    for at, event in enumerate(events):
        row = Row(text(event["fields"]) if name == "fields" else event.get(name) for name in ev.ROW_COLUMNS)
        row.at = at
        rows.append(row)
    return rows


def batches(rows: list, size: int) -> list[list]:
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def documents(rows: list) -> list[dict]:
    return [ev.row_document(RUN, row) for row in rows]


def both(rows, checkpoints=CHECKPOINTS, size=1000, **kwargs):
    """(verify_rows' report, verify_chain's report over the rows' documents)."""
    kwargs.setdefault("event_keys", EVENT_KEYS)
    by_rows = ev.verify_rows(RUN, batches(rows, size), checkpoints, KEYS, **kwargs)
    by_chain = ev.verify_chain(RUN, documents(rows), checkpoints, KEYS, **kwargs)
    return by_rows, by_chain


@pytest.mark.parametrize("size", BATCH_SIZES)
@pytest.mark.parametrize("tamper", list(TAMPER_CASES), ids=lambda f: f.__name__)
def test_every_tamper_case_gets_the_report_verify_chain_gives(tamper, size):
    events, checkpoints, kwargs = tamper()
    by_rows, by_chain = both(rows_of(events), checkpoints or CHECKPOINTS, size, **kwargs)
    assert by_rows == by_chain
    assert by_rows.status != ev.VERIFIED


@pytest.mark.parametrize("size", BATCH_SIZES)
def test_the_untampered_chain_is_verified_without_making_a_document(size, monkeypatch):
    def no_documents(*args):
        raise AssertionError("an untampered row went the long way")

    monkeypatch.setattr(ev, "row_document", no_documents)
    report = ev.verify_rows(
        RUN,
        batches(rows_of(CHAIN), size),
        CHECKPOINTS,
        KEYS,
        expected_head=(HEAD, HASH[HEAD]),
        trusted=(10, HASH[10]),
        event_keys=EVENT_KEYS,
    )
    assert (report.status, report.finding, report.events_checked) == (ev.VERIFIED, None, HEAD)


def test_without_event_keys_the_macs_go_unchecked_as_in_verify_chain():
    events = copy.deepcopy(CHAIN)
    events[3]["mac"] = "hmac-sha256:" + "0" * 64
    by_rows, by_chain = both(rows_of(events), event_keys=None)
    assert by_rows == by_chain
    assert (by_rows.status, by_rows.event_macs) == (ev.VERIFIED, ev.MACS_NOT_CHECKED)


def test_legacy_events_without_a_mac_under_a_checkpoint_verify_as_in_verify_chain():
    events = build()
    for event in events[:10]:
        event["mac_key_id"] = event["mac"] = ""
    by_rows, by_chain = both(rows_of(events), checkpoints_for(events))
    assert by_rows == by_chain
    assert (by_rows.status, by_rows.unsigned_events) == (ev.VERIFIED, 10)


FIELDS_TEXTS = {
    "spaces around": lambda fields: " " + json.dumps(fields) + " ",
    "compact": lambda fields: json.dumps(fields, separators=(",", ":")),
    "escaped": lambda fields: json.dumps(fields, ensure_ascii=True),
    "not json": lambda fields: "{not json",
    "a list": lambda fields: json.dumps([fields]),
    "trailing data": lambda fields: json.dumps(fields) + "{}",
}


@pytest.mark.parametrize("text", list(FIELDS_TEXTS), ids=str)
def test_fields_text_of_any_form_gets_the_report_verify_chain_gives(text):
    by_rows, by_chain = both(rows_of(CHAIN, FIELDS_TEXTS[text]))
    assert by_rows == by_chain


UNUSUAL_VALUES = [
    ("seq", 3.0),
    ("seq", True),
    ("schema_version", True),
    ("schema_version", 1.0),
    ("event_id", None),
    ("event_id", ["not", "hashable"]),
    ("actor", 7),
    ("type", None),
    ("occurred_at", None),
    ("prev_hash", None),
    ("hash", None),
    ("mac_key_id", None),
    ("mac_key_id", "no-such-key"),
    ("mac", None),
    ("mac", "hmac-sha256:é"),
]


@pytest.mark.parametrize(("column", "value"), UNUSUAL_VALUES, ids=lambda v: repr(v))
def test_a_column_of_an_unexpected_type_gets_the_report_verify_chain_gives(column, value):
    rows = rows_of(CHAIN)
    at = ev.ROW_COLUMNS.index(column)
    rows[6] = Row((*rows[6][:at], value, *rows[6][at + 1 :]))
    rows[6].at = 6
    try:
        by_rows = ev.verify_rows(RUN, [rows], CHECKPOINTS, KEYS, event_keys=EVENT_KEYS)
    except ev.InputError as refused:
        with pytest.raises(ev.InputError, match=str(refused)):
            ev.verify_chain(RUN, documents(rows), CHECKPOINTS, KEYS, event_keys=EVENT_KEYS)
        return
    assert by_rows == ev.verify_chain(RUN, documents(rows), CHECKPOINTS, KEYS, event_keys=EVENT_KEYS)
    assert by_rows.status == ev.BROKEN


def test_floats_nested_objects_and_text_of_every_kind_verify_from_rows():
    specs = [
        ("NOTE", {"n": 2.5, "tiny": 1e-07, "big": 10**30, "neg": -3, "zero": 0.0}),
        ("NOTE", {"nested": {"b": [1, {"z": None, "a": True}], "a": "x"}, "ab": 1, "n": 2}),
        ("NOTE", {"text": 'quote " backslash \\ tab \t nl \n ctrl \x01 é \u2028 😀'}),
        ("NOTE", {}),
        ("x.step", {"é": 1, "e": 2, "z": 3}),
    ]
    rows = rows_of(build(specs))
    for text in (json.dumps, lambda fields: json.dumps(fields, ensure_ascii=False)):
        rows = rows_of(build(specs), text)
        by_rows, by_chain = both(rows, [])
        assert by_rows == by_chain
        assert (by_rows.status, by_rows.events_checked) == (ev.UNSEALED, len(specs))


def pulled_by_verify_chain(rows, raise_at=None, checkpoints=CHECKPOINTS, **kwargs):
    """What verify_chain over the rows' documents pulls from its stream, and its outcome when
    pulling the row ``raise_at`` raises."""
    pulled = []

    def stream():
        for row, document in zip(rows, documents(rows), strict=True):
            pulled.append(row.at)
            if row.at == raise_at:
                raise LookupError("observer")
            yield document

    try:
        outcome = ev.verify_chain(RUN, stream(), checkpoints, KEYS, event_keys=EVENT_KEYS, **kwargs)
    except (LookupError, ev.InputError) as exc:
        outcome = repr(exc)
    return pulled, outcome


def observed_by_verify_rows(rows, size, raise_at=None, checkpoints=CHECKPOINTS, **kwargs):
    observed = []

    def observe(seen):
        for row in seen:
            observed.append(row.at)
            if row.at == raise_at:
                raise LookupError("observer")

    try:
        outcome = ev.verify_rows(
            RUN, batches(rows, size), checkpoints, KEYS, event_keys=EVENT_KEYS, observe=observe, **kwargs
        )
    except (LookupError, ev.InputError) as exc:
        outcome = repr(exc)
    return observed, outcome


@pytest.mark.parametrize("size", BATCH_SIZES)
@pytest.mark.parametrize("tamper", list(TAMPER_CASES), ids=lambda f: f.__name__)
def test_the_rows_observed_are_those_verify_chain_reads(tamper, size):
    events, checkpoints, kwargs = tamper()
    rows = rows_of(events)
    kwargs["checkpoints"] = checkpoints or CHECKPOINTS
    pulled, outcome = pulled_by_verify_chain(rows, **kwargs)
    observed, by_rows = observed_by_verify_rows(rows, size, **kwargs)
    assert observed == pulled
    assert by_rows == outcome


@pytest.mark.parametrize("size", [1, 4, 1000])
@pytest.mark.parametrize("tamper", [None, *TAMPER_CASES], ids=lambda f: getattr(f, "__name__", "untampered"))
def test_an_exception_of_the_observer_wins_exactly_when_verify_chain_would_have_read_the_row(tamper, size):
    events, checkpoints, kwargs = tamper() if tamper is not None else (CHAIN, None, {})
    rows = rows_of(events)
    kwargs["checkpoints"] = checkpoints or CHECKPOINTS
    for raise_at in range(len(rows)):
        assert (
            observed_by_verify_rows(rows, size, raise_at, **kwargs)[1]
            == (pulled_by_verify_chain(rows, raise_at, **kwargs)[1])
        ), raise_at


def test_a_row_without_an_integer_seq_is_bad_input_after_the_row_after_it_is_read():
    rows = rows_of(CHAIN)
    rows[4] = Row(("5", *rows[4][1:]))
    rows[4].at = 4
    observed, outcome = observed_by_verify_rows(rows, 3)
    assert (observed, outcome) == pulled_by_verify_chain(rows)
    assert observed == [0, 1, 2, 3, 4, 5]
    assert "InputError" in outcome


def test_duplicate_event_ids_are_found_only_within_the_window_as_in_verify_chain(monkeypatch):
    events = build()
    events[12] = make_event(13, "NOTE", {"again": True}, events[11]["hash"], event_id=events[7]["event_id"])
    events[13] = make_event(14, "x.step", {"n": 3}, events[12]["hash"])
    for window, found in ((4, False), (5, True)):  # seq 8's id again at seq 13
        monkeypatch.setattr(ev, "DUPLICATE_WINDOW", window)
        by_rows, by_chain = both(rows_of(events), [])
        assert by_rows == by_chain
        assert (by_rows.finding is not None) == found


@pytest.mark.parametrize("length", [1, 31, 32, 64, 65, 200])
def test_the_event_signer_computes_hmac_sha256(length):
    key = bytes(range(256))[:length] * 1
    signer = ev.EventSigner("e9", key)
    message = ev.event_mac_message(run_id=RUN, seq=7, hash=HASH[7], key_id="e9")
    expected = "hmac-sha256:" + hmac.new(key, message, hashlib.sha256).hexdigest()
    assert signer.mac(run_id=RUN, seq=7, hash=HASH[7]) == expected == signer.mac_of(message)
    assert signer.mac(run_id=RUN, seq=7, hash=HASH[7]) == ev.event_mac(
        key, run_id=RUN, seq=7, hash=HASH[7], key_id="e9"
    )


@pytest.mark.parametrize(
    "document",
    [
        {"b": 1, "a": [1.5, None, True, {"é": "x\u2028", "d": -0.5}], "": "", "10": 1e-07},
        {"s": 'quote " \\ \n \x00 \x1f \x7f 😀'},
        [],
        "text",
        10**40,
    ],
    ids=repr,
)
def test_canonical_json_is_json_dumps_with_the_rules(document):
    assert ev.canonical_json(document) == json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
    if isinstance(document, dict):
        assert ev._canonical_text(document).encode() == ev.canonical_json(document)


def test_canonical_json_refuses_nan_as_before():
    with pytest.raises(ValueError, match="not JSON compliant"):
        ev.canonical_json({"n": float("nan")})
