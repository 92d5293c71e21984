"""The lifespan's set-based statements: ownership ended for many runs at once, instances
moved between states, and the advisory lock a quota is counted under."""

import hashlib
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Model

from ledger.models import LeaseGrant, Run
from ledger.sql.connection import execute
from ledger.sql.rows import column, prep


@cache
def _set_for_runs_sql(model: type[Model], assigned: tuple[str, ...], unset: str) -> str:
    qn = connection.ops.quote_name
    sql = (
        f"UPDATE {qn(model._meta.db_table)} SET {', '.join(f'{qn(column(model, name))} = %s' for name in assigned)} "
        f"WHERE {qn(column(model, 'run_id'))} = ANY(%s::{Run._meta.pk.db_type(connection)}[])"
    )
    return f"{sql} AND {qn(column(model, unset))} IS NULL" if unset else sql


def set_for_runs(model: type[Model], run_ids: Sequence[object], values: dict[str, Any], *, unset: str = "") -> int:
    """``UPDATE model SET values WHERE run_id IN run_ids`` (and ``unset IS NULL``): one
    statement whatever the number of runs (the ids as one array); the rows changed."""
    params = [prep(model, name, value) for name, value in values.items()]
    return execute(_set_for_runs_sql(model, tuple(values), unset), [*params, list(run_ids)]).rowcount


@cache
def _grants_move_sql() -> str:
    qn = connection.ops.quote_name

    def col(name: str) -> str:
        return qn(column(LeaseGrant, name))

    return (
        f"UPDATE {qn(LeaseGrant._meta.db_table)} SET {col('state')} = %s, {col('state_changed_at')} = %s "
        f"WHERE {col('id')} = ANY(%s::{LeaseGrant._meta.pk.db_type(connection)}[]) AND {col('state')} = %s "
        f"RETURNING {col('id')}"
    )


def grants_move(ids: Sequence[int], *, source: str, target: str, now: datetime) -> set[int]:
    """The instances ``ids`` still in ``source`` moved to ``target`` in one conditional
    UPDATE: the ids it moved."""
    rows = execute(_grants_move_sql(), [target, now, list(ids), source]).fetchall()
    return {pk for (pk,) in rows}


def advisory_lock(*parts: object) -> None:
    """A transaction-scoped advisory lock on ``parts`` (held until the transaction ends)."""
    key = int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big", signed=True)
    execute("SELECT pg_advisory_xact_lock(%s)", [key])
