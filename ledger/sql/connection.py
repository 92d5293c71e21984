"""How a statement of ``ledger.sql`` reaches PostgreSQL: :func:`execute`.

Statements are written with ``%s`` placeholders (``%%`` for a literal ``%``) and sent with
PostgreSQL's own ``$n`` placeholders through a :class:`psycopg.RawCursor` (server-side
binding): psycopg then has nothing to parse, whatever the statement's length or number of
parameters. Each text is numbered once per process. A statement is prepared from its
``prepare_threshold``-th use on a connection (``DB_PREPARE_THRESHOLD``; off with 0), so
PostgreSQL parses and plans each shape once per connection and then only executes it.
Lists go as binary arrays (no text escaping of every value).
"""

import re
from collections.abc import Sequence
from typing import Any, Protocol
from weakref import WeakKeyDictionary

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from psycopg.types.array import ListBinaryDumper


class Result(Protocol):
    """What :func:`execute` returns: the statement's rows and row count."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


# One cursor per open connection, reused statement after statement (each caller fetches its
# rows before the next statement).
_cursors: "WeakKeyDictionary[psycopg.Connection[Any], psycopg.RawCursor[Any]]" = WeakKeyDictionary()

_PLACEHOLDER = re.compile(r"%([sbt%])")
_numbered: dict[str, str] = {}


def numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders as ``$1``, ``$2``, ... and ``%%`` as ``%``."""
    found = _numbered.get(sql)
    if found is None:
        count = 0

        def number(match: re.Match[str]) -> str:
            nonlocal count
            if match.group(1) == "%":
                return "%"
            count += 1
            return f"${count}"

        found = _numbered[sql] = _PLACEHOLDER.sub(number, sql)
    return found


def database() -> BaseDatabaseWrapper:
    """This thread's default connection itself (not the ``django.db.connection`` proxy,
    each attribute read through which costs a context-local lookup)."""
    return connections[DEFAULT_DB_ALIAS]


def _cursor(raw: psycopg.Connection[Any]) -> psycopg.RawCursor[Any]:
    cursor = _cursors.get(raw)
    if cursor is None or cursor.closed:
        cursor = _cursors[raw] = psycopg.RawCursor(raw)
        cursor.adapters.register_dumper(list, ListBinaryDumper)
    return cursor


def execute(sql: str, params: Sequence[Any]) -> Result:
    """Run one statement of this package and return its cursor, to fetch from before the
    next statement.

    With nothing watching the connection it goes straight to psycopg (Django's cursor
    wrapper costs about as much CPU as the round trip); when the query log is on or an
    execute wrapper is installed (a test's query counter, a benchmark's meter, the chain's
    held-back updates) it goes through Django's wrapper, which calls them."""
    db = database()
    raw = db.connection
    if raw is None:
        db.ensure_connection()
        raw = db.connection
    cursor = _cursor(raw)
    text = numbered(sql)
    if db.queries_logged:
        wrapped = CursorDebugWrapper(cursor, db)
        with wrapped.debug_sql(text, params):  # logged as PostgreSQL receives it
            CursorWrapper.execute(wrapped, text, params)
        return cursor
    if db.execute_wrappers:
        CursorWrapper(cursor, db).execute(text, params)
        return cursor
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        cursor.execute(text, params)
    return cursor
