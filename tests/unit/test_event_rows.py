"""The rows the in-app verifier reads (``event_rows``: PostgreSQL writes event_id and
occurred_at as the canonical strings, fields as its JSON text) stand for exactly the
documents the ORM gives (``event_document``), at every edge of the time's form."""

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from fenceline_client.evidence_verifier import row_document
from ledger.chain import event_document
from ledger.models import Event
from ledger.services.evidence.verification import CHUNK_ROWS, event_rows
from tests.factories import new_run

TIMES = [
    datetime(2026, 12, 5, 13, 0, 0, tzinfo=UTC),  # no microseconds
    datetime(2026, 12, 5, 13, 0, 0, 1, tzinfo=UTC),
    datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5))),  # another day in UTC
    datetime(1000, 1, 1, tzinfo=UTC),
    datetime(999, 12, 31, 23, 59, 59, 500000, tzinfo=UTC),  # Python writes the year without leading zeros
    datetime(5, 6, 7, 8, 9, 10, 11, tzinfo=UTC),
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]
FIELDS = [
    {},
    {"step": 1, "note": "checked"},
    {"n": 2.5, "tiny": 1e-07, "big": 10**30, "one": 1.0, "nested": {"b": [1, None, True], "a": "é\u2028"}},
    {"text": 'quote " backslash \\ tab \t ctrl \x01 😀', "ab": 1, "b": 2},
]


@pytest.fixture
def run(acme):
    return new_run(acme.worker)


def stored(run, entries: list[tuple[datetime, dict]]) -> list[Event]:
    events = [
        Event(
            run=run,
            seq=100 + n,
            event_id=uuid.uuid4(),
            type="NOTE",
            actor="worker:w/é",
            occurred_at=moment,
            fields=fields,
            prev_hash="sha256:" + "0" * 64,
            hash="sha256:" + "1" * 64,
            mac_key_id="e1",
            mac="hmac-sha256:" + "2" * 64,
        )
        for n, (moment, fields) in enumerate(entries)
    ]
    Event.objects.bulk_create(events)
    return events


def read(run, upto: int) -> list[tuple]:
    with event_rows(run_id=run.pk, upto=upto) as batches:
        return [row for batch in batches for row in batch]


def test_rows_stand_for_the_documents_the_orm_gives(run):
    stored(run, [(moment, fields) for moment in TIMES for fields in FIELDS])
    run_id = str(run.pk)
    rows = read(run, 10**6)
    orm = [event_document(event) for event in Event.objects.filter(run=run).order_by("seq", "pk")]
    assert [row_document(run_id, row) for row in rows] == orm
    assert len(rows) == 1 + len(TIMES) * len(FIELDS)


def test_rows_stop_at_the_head_read_first(run):
    stored(run, [(TIMES[0], {})] * 3)
    assert [row[0] for row in read(run, 101)] == [1, 100, 101]


def test_rows_come_in_batches_of_one_fetch(run):
    stored(run, [(TIMES[0], {"n": n}) for n in range(CHUNK_ROWS + 1)])
    with event_rows(run_id=run.pk, upto=10**6) as batches:
        assert [len(batch) for batch in batches] == [CHUNK_ROWS, 2]


def test_a_time_no_python_datetime_holds_comes_back_empty(run):
    # Written by someone with database access: the canonical form has no text for it, and
    # the event then fails the check of its type (mutated).
    stored(run, [(TIMES[0], {})])
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_event (run_id, seq, event_id, type, actor, occurred_at, fields, prev_hash, hash, "
            "mac_key_id, mac, schema_version) SELECT run_id, 200, %s, type, actor, '10000-01-01T00:00:00Z', fields, "
            "prev_hash, hash, mac_key_id, mac, schema_version FROM ledger_event WHERE run_id = %s AND seq = 100",
            [uuid.uuid4(), run.pk],
        )
    rows = read(run, 10**6)
    assert [row[0] for row in rows] == [1, 100, 200]
    assert rows[1][5] == "2026-12-05T13:00:00.000000Z"
    assert rows[2][5] is None
