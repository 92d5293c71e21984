"""The verifier's read of a chain: a run's stored events as the standalone verifier reads an
export, streamed in batches from a server-side cursor."""

import functools
import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache
from typing import Any

from django.db import connection, transaction

from ledger.models import DiagnosticPayload, Event

type Rows = list[Sequence[Any]]


@cache
def _rows_sql(columns: tuple[str, ...]) -> str:
    """The event rows of one run up to a seq, in the order stored (seq, then id), as
    ``columns``. PostgreSQL writes event_id and occurred_at as the canonical strings
    (``str(uuid)``; ``format_time``: UTC, the year without leading zeros as Python's
    strftime writes it); a time outside the years 1-9999, which no Python datetime holds,
    comes back NULL, and the event fails the check of its type. ``fields`` comes as JSON
    text."""
    in_years = "occurred_at >= '0001-01-01T00:00:00Z' AND occurred_at < '10000-01-01T00:00:00Z'"
    time_text = (
        f"""CASE WHEN {in_years} THEN to_char(occurred_at AT TIME ZONE 'UTC', 'FMYYYY-MM-DD"T"HH24:MI:SS.US"Z"') END"""
    )
    expressions = {"event_id": "event_id::text", "occurred_at": time_text, "fields": "fields::text"}
    select = ", ".join(expressions.get(name, name) for name in columns)
    table = connection.ops.quote_name(Event._meta.db_table)
    return f"SELECT {select} FROM {table} WHERE run_id = %s AND seq <= %s ORDER BY seq, id"


_cursor_names = itertools.count()


@contextmanager
def event_rows(*, run_id: object, upto: int, columns: tuple[str, ...], batch: int) -> Iterator[Iterator[Rows]]:
    """The stored events of ``run_id`` at or below seq ``upto``: batches of ``batch`` rows,
    so that memory holds two batches whatever the length of the chain. Each batch is one
    FETCH from a server-side cursor (the next one fetched while the caller checks this
    one), in a transaction of its own (or a savepoint: a read, nothing to commit; the cursor
    lives in it, so a pooler in transaction mode keeps it); leaving the block early closes
    the cursor."""
    with transaction.atomic():
        connection.ensure_connection()
        name = f"fenceline_verify_{next(_cursor_names)}"
        with connection.connection.cursor(name=name) as cursor:
            cursor.execute(_rows_sql(columns), [run_id, upto])
            batches = _fetched_ahead(functools.partial(cursor.fetchmany, batch))
            try:
                yield batches
            finally:
                batches.close()  # waits for a fetch in flight before the cursor closes


def _fetched_ahead(fetch: Callable[[], Rows]) -> Generator[Rows]:
    """The batches ``fetch()`` returns until an empty one, each next one fetched on a helper
    thread while the caller checks the one before: the server's time and the network's
    then overlap with the hashing, instead of adding to it. One fetch at a time, so the
    cursor is only ever used by one thread at once; closing this generator waits for the
    fetch in flight."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-fetch") as pool:
        pending = pool.submit(fetch)
        while batch := pending.result():
            pending = pool.submit(fetch)
            yield batch


# --- the diagnostic plane ---------------------------------------------------------------


@cache
def _payload_rows_sql() -> str:
    qn = connection.ops.quote_name
    events, payloads = qn(Event._meta.db_table), qn(DiagnosticPayload._meta.db_table)
    return (
        f"SELECT e.seq, e.fields::text, p.id IS NOT NULL, p.body::text, p.removed_at "
        f"FROM {events} e LEFT JOIN {payloads} p ON p.run_id = e.run_id AND p.seq = e.seq "
        f"WHERE e.run_id = %s AND e.seq <= %s AND e.schema_version = %s ORDER BY e.seq"
    )


def payload_rows(*, run_id: object, upto: int, version: int, batch: int) -> Iterator[Rows]:
    """The events of ``run_id`` at or below seq ``upto`` of schema version ``version`` with
    what the diagnostic plane keeps for each: (seq, fields as JSON text, whether a payload
    row exists, its body as JSON text or NULL, when retention removed it or NULL), in
    batches of ``batch`` rows from a server-side cursor."""
    with transaction.atomic():
        connection.ensure_connection()
        with connection.connection.cursor(name=f"fenceline_payloads_{next(_cursor_names)}") as cursor:
            cursor.execute(_payload_rows_sql(), [run_id, upto, version])
            while rows := cursor.fetchmany(batch):
                yield rows
