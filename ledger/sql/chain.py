"""A transition's commit: its held-back conditional UPDATEs, its events' INSERT and the run
head's UPDATE; and, for many runs at once (a reaper's batch), the events and the heads as
statements of arrays.
"""

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from operator import attrgetter
from typing import Any

from django.db import connection
from django.db.models import ForeignKey, Model

from ledger.models import Event, Run
from ledger.sql.connection import execute
from ledger.sql.rows import column, insert_sql, params, prep, update_sql

type Row = tuple[Any, ...]

# The columns of an event's INSERT: all but the generated primary key.
EVENT_INSERTED = tuple(f.attname for f in Event._meta.concrete_fields if not f.primary_key)
_RETURNING = "RETURNING id, event_id"


@dataclass(frozen=True)
class Update:
    """A conditional UPDATE of ``model`` that must change exactly one row: ``assigned``
    columns set where the ``where`` columns equal their values (``values``: the assigned
    values, then the where values, as :func:`ledger.sql.rows.prep` sends them)."""

    model: type[Model]
    assigned: tuple[str, ...]
    where: tuple[str, ...]
    values: list[Any]

    def sql(self) -> str:
        return update_sql(self.model, self.assigned, self.where)


def update_one(update: Update) -> bool:
    """Run ``update`` alone: whether it changed exactly one row."""
    return execute(update.sql(), update.values).rowcount == 1


@cache
def _transition_sql(events: int, updates: tuple[str, ...], head: tuple[str, ...]) -> str:
    """One round trip: the updates, the events' INSERT and the run head's UPDATE as
    data-modifying CTEs (PostgreSQL runs each once, to completion), answering how many rows
    each update changed. The events' foreign key sees the run row either way."""
    head_sql = update_sql(Run, head, ("id",))
    parts = [f"u{i} AS ({sql} RETURNING 1)" for i, sql in enumerate(updates)]
    parts += [f"appended AS ({insert_sql(Event, EVENT_INSERTED, events)} {_RETURNING})", f"head AS ({head_sql})"]
    counts = [f"(SELECT count(*) FROM u{i})" for i in range(len(updates))]
    return f"WITH {', '.join(parts)} SELECT {', '.join([*counts, 'id', 'event_id'])} FROM appended"


def transition(*, updates: Sequence[Update], events: Sequence[Event], run: Run, head: tuple[str, ...]) -> list[Row]:
    """Commit one run's transition in one statement: ``updates``, ``events`` and the head
    fields ``head`` of ``run``. One row per event: the count of rows each update changed,
    then the event's id and event id."""
    values = [v for update in updates for v in update.values]
    values += [p for event in events for p in params(Event, EVENT_INSERTED, event)]
    values += [*params(Run, head, run), run.pk]
    sql = _transition_sql(len(events), tuple(update.sql() for update in updates), head)
    return execute(sql, values).fetchall()


@cache
def _inserting_sql(
    model: type[Model], names: tuple[str, ...], conflict: tuple[str, ...], events: int, head: tuple[str, ...]
) -> str:
    qn = connection.ops.quote_name
    columns = ", ".join(qn(column(Event, name)) for name in EVENT_INSERTED)
    row = f"({', '.join(['%s'] * len(EVENT_INSERTED))})"
    head_sql = update_sql(Run, head, ("id",))
    values = ", ".join([row] * events)
    inserted = f"inserted AS ({insert_sql(model, names, 1, conflict)} RETURNING 1)"
    appended = f"appended AS (INSERT INTO {qn(Event._meta.db_table)} ({columns}) SELECT * FROM (VALUES {values}) AS v"
    appended += f" WHERE EXISTS (SELECT 1 FROM inserted) {_RETURNING})"
    return f"WITH {inserted}, {appended}, head AS ({head_sql} AND EXISTS (SELECT 1 FROM inserted)) SELECT id, event_id FROM appended"


def inserting(
    *,
    names: tuple[str, ...],
    row: list[Any],
    model: type[Model],
    conflict: tuple[str, ...],
    events: Sequence[Event],
    run: Run,
    head: tuple[str, ...],
) -> list[Row]:
    """One row of ``model`` (its columns ``names``, values ``row``) inserted, skipped on a
    ``conflict`` of that unique key; ``events`` and ``run``'s head written in the same
    statement only when the row was: the events' (id, event id), or no rows."""
    values = [*row, *(p for event in events for p in params(Event, EVENT_INSERTED, event)), *params(Run, head, run)]
    return execute(_inserting_sql(model, names, conflict, len(events), head), [*values, run.pk]).fetchall()


# --- many runs at once: one statement of arrays, whatever the number of rows ----------------


@cache
def _insert_events_sql() -> str:
    qn = connection.ops.quote_name
    columns = ", ".join(qn(column(Event, name)) for name in EVENT_INSERTED)
    arrays = ", ".join(_array_casts(Event, EVENT_INSERTED))
    return f"INSERT INTO {qn(Event._meta.db_table)} ({columns}) SELECT * FROM unnest({arrays}) {_RETURNING}"


def insert_events(events: Sequence[Event]) -> list[Row]:
    """``events`` in one INSERT of arrays: their (id, event id)."""
    return execute(_insert_events_sql(), array_columns(Event, EVENT_INSERTED, events)).fetchall()


@cache
def _update_heads_sql(head: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name
    names = [qn(column(Run, name)) for name in ("id", *head)]
    assignments = ", ".join(f"{name} = v.{name}" for name in names[1:])
    arrays = ", ".join(_array_casts(Run, ("id", *head)))
    return (
        f"UPDATE {qn(Run._meta.db_table)} AS r SET {assignments} "
        f"FROM unnest({arrays}) AS v({', '.join(names)}) WHERE r.id = v.id"
    )


def update_heads(runs: Sequence[Run], head: tuple[str, ...]) -> None:
    """The head fields ``head`` of many runs in one ``UPDATE ... FROM unnest(...)``: what
    bulk_update's CASE expressions say, without the ORM compiling one expression per run
    and field, and in one statement text whatever the number of runs."""
    execute(_update_heads_sql(head), array_columns(Run, ("id", *head), runs))


def array_columns(model: type[Model], names: tuple[str, ...], instances: Sequence[Model]) -> list[list[Any]]:
    """The values of ``instances``' fields ``names``, one list per field: the arrays of an
    ``unnest`` statement, each value as :func:`ledger.sql.rows.prep` sends it. Integers,
    strings, UUIDs and aware times go as they are (the statement casts each array)."""
    read = _getter(model, names)
    if len(names) == 1:
        columns = [[read(instance) for instance in instances]]
    else:
        columns = [list(column) for column in zip(*map(read, instances), strict=True)] or [[] for _ in names]
    for index, (name, plain) in enumerate(zip(names, _plain_checks(model, names), strict=True)):
        values = columns[index]
        if plain is None or not all(value is None or plain(value) for value in values):
            values = [prep(model, name, value) for value in values]
            if plain is _is_int:  # psycopg's integer wrappers: one kind per array
                values = [None if value is None else int(value) for value in values]
            columns[index] = values
    return columns


@cache
def _getter(model: type[Model], names: tuple[str, ...]) -> Callable[[Any], Any]:
    return attrgetter(*names)


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_uuid(value: object) -> bool:
    return type(value) is uuid.UUID


def _is_aware(value: object) -> bool:
    return type(value) is datetime and value.tzinfo is not None


_PLAIN_CHECKS = {"UUIDField": _is_uuid, "CharField": _is_str, "TextField": _is_str, "DateTimeField": _is_aware}


@cache
def _plain_checks(model: type[Model], names: tuple[str, ...]) -> tuple[Callable[[object], bool] | None, ...]:
    """Per field, whether a value goes to the database as it is (None: every value goes
    through its field's preparation)."""
    fields = {field.attname: field for field in model._meta.concrete_fields}
    checks = []
    for name in names:
        kind = _internal_type(fields[name])
        checks.append(_is_int if kind.endswith("IntegerField") else _PLAIN_CHECKS.get(kind))
    return tuple(checks)


def _internal_type(field: Any) -> str:
    return str((field.target_field if isinstance(field, ForeignKey) else field).get_internal_type())


def _array_casts(model: type[Model], names: tuple[str, ...]) -> list[str]:
    """``%s::<type>[]`` for each field: text for character fields (an explicit cast to
    varchar(n) would cut a longer value instead of refusing it; the column's own
    assignment cast refuses it)."""
    fields = {field.attname: field for field in model._meta.concrete_fields}
    casts = []
    for name in names:
        field = fields[name]
        cast = "text" if _internal_type(field) in ("CharField", "TextField") else field.cast_db_type(connection)
        casts.append(f"%s::{cast}[]")
    return casts
