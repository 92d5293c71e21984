"""A dispatch's charges and a reservation's settlement, each in one statement.

Rows are locked in the order every path takes (the LOCK ORDER of
``ledger.services.authority.reservations``): the windows charged directly, in budget order,
then the shards, in budget order. Each part of a statement waits for the one before it (its
WHERE reads that part's count).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection
from psycopg.types.numeric import Int8

from ledger.models import CapabilityBudget, CostReservation, CostShard, CostWindow
from ledger.sql.connection import execute
from ledger.sql.rows import attnames, column, insert_params
from ledger.states import CapabilityStatus

type Row = tuple[Any, ...]

# A window's place in the lock order: its budget kind, in the order the budgets are listed.
RANK = "array_position(ARRAY['RUN', 'TENANT', 'PROVIDER', 'RETRY']::varchar[], w.kind)"
# A window's reserved and settled cents with its shards', in SQL (``w`` the window).
_TOTAL_USED = (
    "w.reserved_cents + w.settled_cents "
    "+ COALESCE((SELECT sum(s.reserved_cents + s.settled_cents) FROM {shard} s WHERE s.window_id = w.id), 0)"
)
_BY_KEY = "w.tenant_id = %s AND w.kind = %s AND w.key = %s AND w.starts_at = %s"


@dataclass(frozen=True)
class Key:
    """One budget's window of this period: (kind, key), and whether it may be escrowed."""

    kind: str
    key: str
    escrowed: bool


@dataclass(frozen=True)
class Spend:
    """The capability call a dispatch spends with its charges."""

    capability_id: object
    payload_bytes: int
    limited_bytes: bool
    now: datetime


class _Parts:
    """The CTEs of the charge statement, each after the one before it."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.previous: str | None = None

    def add(self, name: str, body: str) -> None:
        self.parts.append(f"{name} AS ({body})")
        self.previous = name

    def after_previous(self) -> str:
        return f"(SELECT count(*) FROM {self.previous}) >= 0 AND " if self.previous else ""


@cache
def _charge_sql(escrowed: tuple[bool, ...], capability: bool, has_bytes: bool, tenant_at: int | None) -> str:
    qn = connection.ops.quote_name
    window, shard = qn(CostWindow._meta.db_table), qn(CostShard._meta.db_table)
    ctes = _Parts()
    granted, window_ids, shard_ids, returned = [], [], [], []
    for i in range(len(escrowed)):
        ctes.add(
            f"d{i}",
            f"UPDATE {window} w SET reserved_cents = w.reserved_cents + %s WHERE {ctes.after_previous()}{_BY_KEY} "
            "AND w.shard_count = 0 AND w.reserved_cents + w.settled_cents + w.escrowed_cents + %s <= w.limit_cents "
            "RETURNING w.id",
        )
        window_ids.append(f"SELECT id FROM d{i}")
    for i, can_escrow in enumerate(escrowed):
        count = f"(SELECT count(*) FROM d{i})"
        returned.append(f"(SELECT id FROM d{i})")
        if can_escrow:
            ctes.add(
                f"s{i}",
                f"UPDATE {shard} s SET reserved_cents = s.reserved_cents + %s FROM {window} w "
                f"WHERE {ctes.after_previous()}{_BY_KEY} AND w.shard_count > 0 AND s.window_id = w.id "
                "AND s.shard = mod(%s, w.shard_count) AND s.reserved_cents + s.settled_cents + %s <= s.allotted_cents "
                "RETURNING s.id, s.window_id",
            )
            count += f" + (SELECT count(*) FROM s{i})"
            window_ids.append(f"SELECT window_id FROM s{i}")
            shard_ids.append(f"SELECT id FROM s{i}")
            returned.append(f"(SELECT id FROM s{i})")
        else:
            returned.append("NULL::bigint")
        granted.append(f"{count} = 1")
    if capability:
        table = qn(CapabilityBudget._meta.db_table)
        within = " AND used_bytes <= max_bytes - %s" if has_bytes else ""
        ctes.add(
            "cap",
            f"UPDATE {table} SET used_calls = used_calls + 1, used_bytes = used_bytes + %s "
            f"WHERE {ctes.after_previous()}id = %s AND status = '{CapabilityStatus.ACTIVE.value}' AND expires_at > %s "
            f"AND used_calls < max_calls{within} RETURNING 1",
        )
        granted.append("(SELECT count(*) FROM cap) = 1")
        returned.append("(SELECT count(*) FROM cap)")
    else:
        returned.append("0")
    parts = [
        *ctes.parts,
        f"ok AS (SELECT {' AND '.join(granted) or 'true'} AS granted)",
        *_reservation_inserts(window_ids, shard_ids),
    ]
    selected = ["(SELECT granted FROM ok)", *returned]
    tail = ""
    if tenant_at is not None:  # the TENANT window as the statement's snapshot saw it, for the breaker
        selected += ["w.limit_cents", _TOTAL_USED.format(shard=shard)]
        tail = f" FROM (VALUES (1)) AS one(x) LEFT JOIN {window} w ON {_BY_KEY}"
    return f"WITH {', '.join(parts)} SELECT {', '.join(selected)}{tail}"


def _reservation_inserts(window_ids: list[str], shard_ids: list[str]) -> list[str]:
    """The reservation's INSERT when every charge was granted, with its links."""
    qn = connection.ops.quote_name
    names = attnames(CostReservation)
    columns = ", ".join(qn(column(CostReservation, name)) for name in names)
    parts = [
        f"r AS (INSERT INTO {qn(CostReservation._meta.db_table)} ({columns}) "
        f"SELECT {', '.join(['%s'] * len(names))} FROM ok WHERE ok.granted RETURNING id)"
    ]
    if window_ids:  # (a reservation under no limit has no window)
        parts.append(
            f"lw AS (INSERT INTO {qn(CostReservation.windows.through._meta.db_table)} (costreservation_id, costwindow_id) "
            f"SELECT r.id, x.id FROM r, ({' UNION ALL '.join(window_ids)}) x(id))"
        )
    if shard_ids:
        parts.append(
            f"ls AS (INSERT INTO {qn(CostReservation.shards.through._meta.db_table)} (costreservation_id, costshard_id) "
            f"SELECT r.id, x.id FROM r, ({' UNION ALL '.join(shard_ids)}) x(id))"
        )
    return parts


def charge(
    *,
    keys: Sequence[Key],
    tenant_id: object,
    starts_at: datetime,
    estimate: int,
    run_hash: int,
    spend: Spend | None,
    reservation: CostReservation,
    tenant_at: int | None,
) -> Row:
    """Every charge of a dispatch as one statement: each key's window of the period
    starting at ``starts_at`` (or its escrow shard for ``run_hash``), the capability call,
    and — only when every one was granted — ``reservation`` with its links. The row:
    whether all were granted; per key the window id and the shard id charged (or NULL);
    whether the capability call was taken; with ``tenant_at`` (that key's index), the
    TENANT window's limit and use before this charge."""
    shape = tuple(key.escrowed for key in keys)
    sql = _charge_sql(shape, spend is not None, spend is not None and spend.limited_bytes, tenant_at)
    est, hashed = Int8(estimate), Int8(run_hash)
    values: list[Any] = []
    for key in keys:  # the direct charges first, then the shards (as the statement writes them)
        values += [est, tenant_id, key.kind, key.key, starts_at, est]
    for key in keys:
        if key.escrowed:
            values += [est, tenant_id, key.kind, key.key, starts_at, hashed, est]
    if spend is not None:
        need = Int8(spend.payload_bytes)
        values += [need, spend.capability_id, spend.now] + ([need] if spend.limited_bytes else [])
    values += insert_params(reservation)[1]
    if tenant_at is not None:
        values += [tenant_id, keys[tenant_at].kind, keys[tenant_at].key, starts_at]
    row: Row = execute(sql, values).fetchone()
    return row


@cache
def _settle_sql(with_tenant: bool) -> str:
    qn = connection.ops.quote_name
    reservations, window, shard = (
        qn(CostReservation._meta.db_table),
        qn(CostWindow._meta.db_table),
        qn(CostShard._meta.db_table),
    )
    by_window = qn(CostReservation.windows.through._meta.db_table)
    by_shard = qn(CostReservation.shards.through._meta.db_table)
    parts = [
        f"r AS (UPDATE {reservations} SET state = %s, actual_cents = %s, closed_at = %s WHERE id = %s AND state = %s RETURNING 1)",
        f"lw AS (SELECT w.id FROM {window} w JOIN {by_window} l ON w.id = l.costwindow_id "
        f"WHERE l.costreservation_id = %s AND w.shard_count = 0 ORDER BY {RANK}, w.key FOR NO KEY UPDATE OF w)",
        f"ls AS (SELECT s.id FROM {shard} s JOIN {by_shard} l ON s.id = l.costshard_id JOIN {window} w ON w.id = s.window_id "
        f"WHERE (SELECT count(*) FROM lw) >= 0 AND l.costreservation_id = %s ORDER BY {RANK}, w.key FOR NO KEY UPDATE OF s)",
        f"w AS (UPDATE {window} w SET reserved_cents = w.reserved_cents - %s, settled_cents = w.settled_cents + %s "
        "WHERE w.id IN (SELECT id FROM lw) AND %s <= w.limit_cents - w.escrowed_cents - w.settled_cents - w.reserved_cents + %s "
        "RETURNING w.id)",
        f"s AS (UPDATE {shard} s SET reserved_cents = s.reserved_cents - %s, settled_cents = s.settled_cents + %s "
        "WHERE s.id IN (SELECT id FROM ls) AND %s <= s.allotted_cents - s.settled_cents - s.reserved_cents + %s "
        "RETURNING s.id, s.window_id)",
    ]
    selected = [
        "(SELECT count(*) FROM r)",
        "(SELECT array_agg(id) FROM w)",
        "(SELECT array_agg(ARRAY[id, window_id]) FROM s)",
        "(SELECT count(*) FROM lw)",
        "(SELECT count(*) FROM ls)",
    ]
    tail = ""
    if with_tenant:
        selected += ["w.id", "w.limit_cents", _TOTAL_USED.format(shard=shard)]
        tail = f" FROM (VALUES (1)) AS one(x) LEFT JOIN {window} w ON {_BY_KEY}"
    return f"WITH {', '.join(parts)} SELECT {', '.join(selected)}{tail}"


def settle(
    *,
    reservation_id: object,
    source: str,
    target: str,
    estimate: int,
    amount: int,
    now: datetime,
    tenant_window: tuple[object, str, str, datetime] | None,
) -> Row:
    """The reservation moved from ``source`` to ``target`` with ``amount`` and every
    window and shard it charged settled, each only where the amount fits whole, in one
    statement that locks them first. The row: reservations moved (1), the window ids
    settled, the [shard id, window id] pairs settled, how many windows and shards it
    charged; with ``tenant_window`` (tenant id, kind, key, period start), that window's id,
    limit and use before this statement."""
    est, amt = Int8(estimate), Int8(amount)
    values: list[Any] = [target, amt, now, reservation_id, source, reservation_id, reservation_id]
    values += [est, amt, amt, est]  # windows
    values += [est, amt, amt, est]  # shards
    if tenant_window is not None:
        values += list(tenant_window)
    row: Row = execute(_settle_sql(tenant_window is not None), values).fetchone()
    return row
