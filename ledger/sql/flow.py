"""Flow control at dispatch, one statement each (``ledger/services/authority/flow.py``).

A concurrency limit's places (:class:`~ledger.models.FlowSlot`) are taken with ``FOR UPDATE
SKIP LOCKED``: a taker never waits for a place, so places add nothing to any lock order (a
place being taken or given back by another transaction counts as held until it commits: a
refusal may be early, never an excess).

A rate limit's token-bucket shards (:class:`~ledger.models.FlowBucket`) are read by the
database's clock (``clock_timestamp()``, once per statement): what a shard earned since
``refilled_at`` is added, up to its capacity, in the UPDATE that takes a token. Shard i of a
key of burst B and rate R in n shards holds up to ``B / n + (i < B % n)`` tokens (integer
division: the capacities add up to B) and earns ``R / n`` per second. A shard's
``refilled_at`` never moves back (``GREATEST``), so what all shards credit in all is at most R
times the time since they were opened.
"""

from datetime import datetime
from functools import cache

from django.db import connection
from psycopg.types.numeric import Float8, Int8

from ledger.models import FlowBucket, FlowSlot
from ledger.sql.connection import execute

# The bucket's parameters and the clock, once per statement: burst B, shards n, rate R, the
# shard the caller starts from.
_PARAMS = "p AS (SELECT %s::int AS burst, %s::int AS n, %s::float8 AS rate, %s::int AS home, clock_timestamp() AS now)"
_CAPACITY = "(p.burst / p.n + (b.shard < p.burst %% p.n)::int)"
_EARNED = (
    f"LEAST({_CAPACITY}, b.tokens + (p.rate / p.n) * GREATEST(0, EXTRACT(EPOCH FROM p.now - b.refilled_at)::float8))"
)


def _table(model: type[FlowSlot] | type[FlowBucket]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


@cache
def _slot_take_sql() -> str:
    slots = _table(FlowSlot)
    return (
        f"UPDATE {slots} s SET operation_id = %s, taken_at = %s WHERE s.operation_id IS NULL AND s.id = ("
        f"SELECT f.id FROM {slots} f WHERE f.tenant_id = %s AND f.key = %s AND f.slot < %s AND f.operation_id IS NULL "
        "ORDER BY f.slot LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING s.id"
    )


def slot_take(*, tenant_id: object, key: str, places: int, operation_id: object, now: datetime) -> bool:
    """Give ``operation_id`` a free place of ``key`` below ``places``; False when none is free."""
    return execute(_slot_take_sql(), [operation_id, now, tenant_id, key, Int8(places)]).fetchone() is not None


@cache
def _slots_open_sql() -> str:
    return (
        f"INSERT INTO {_table(FlowSlot)} (schema_version, tenant_id, key, slot) "
        "SELECT %s, %s, %s, g FROM generate_series(0, %s - 1) g ON CONFLICT DO NOTHING"
    )


def slots_open(*, tenant_id: object, key: str, places: int, version: int) -> int:
    """Create the missing places 0 .. places-1 of ``key`` (concurrent first uses agree);
    how many this call created."""
    return execute(_slots_open_sql(), [version, tenant_id, key, Int8(places)]).rowcount


@cache
def _bucket_take_sql(wait: bool) -> str:
    buckets = _table(FlowBucket)
    # Waiting, in shard order (so two waiters never wait for each other); not waiting, from
    # the caller's home shard on.
    order, skip = ("b.shard", "") if wait else ("mod(b.shard - p.home + p.n, p.n)", " SKIP LOCKED")
    return (
        f"WITH {_PARAMS}, c AS (SELECT b.id FROM {buckets} b, p WHERE b.tenant_id = %s AND b.key = %s "
        f"AND b.shard < p.n AND {_EARNED} >= 1 ORDER BY {order} LIMIT 1 FOR UPDATE OF b{skip}) "
        f"UPDATE {buckets} b SET tokens = {_EARNED} - 1, refilled_at = GREATEST(b.refilled_at, p.now), "
        f"taken = b.taken + 1, earned = b.earned + {_EARNED} - b.tokens FROM p WHERE b.id IN (SELECT id FROM c) AND {_EARNED} >= 1 RETURNING b.id"
    )


def bucket_take(*, tenant_id: object, key: str, burst: int, shards: int, per_s: float, home: int, wait: bool) -> bool:
    """Take one token of ``key``'s bucket from a shard that has a whole token once refilled.
    Without ``wait``: from shard ``home`` on (wrapping), passing over a shard another
    dispatch holds. With ``wait``: in shard order, waiting for a held shard and reading it
    again after its commit. A shard read again and found empty stays locked by this
    statement (PostgreSQL's READ COMMITTED recheck): run a statement that fails in a
    savepoint rolled back, so that no lock outlives it."""
    values = [Int8(burst), Int8(shards), Float8(per_s), Int8(home), tenant_id, key]
    return execute(_bucket_take_sql(wait), values).fetchone() is not None


@cache
def _buckets_open_sql() -> str:
    return (
        f"WITH {_PARAMS} INSERT INTO {_table(FlowBucket)} AS b "
        "(schema_version, tenant_id, key, shard, tokens, refilled_at, created_at, taken, earned) "
        "SELECT %s, %s, %s, g, p.burst / p.n + (g < p.burst %% p.n)::int, p.now, p.now, 0, 0 "
        "FROM p, generate_series(0, p.n - 1) g ON CONFLICT DO NOTHING"
    )


def buckets_open(*, tenant_id: object, key: str, burst: int, shards: int, version: int) -> int:
    """Create the missing shards 0 .. shards-1 of ``key``'s bucket, full; how many this call created."""
    values = [Int8(burst), Int8(shards), Float8(0), Int8(0), version, tenant_id, key]
    return execute(_buckets_open_sql(), values).rowcount


@cache
def _bucket_wait_sql() -> str:
    return (
        f"WITH {_PARAMS} SELECT min((1 - {_EARNED}) / (p.rate / p.n)) FROM {_table(FlowBucket)} b, p "
        "WHERE b.tenant_id = %s AND b.key = %s AND b.shard < p.n"
    )


def bucket_wait_s(*, tenant_id: object, key: str, burst: int, shards: int, per_s: float) -> float:
    """Seconds until some shard of ``key``'s bucket holds a whole token again (by the
    database's clock; 0 when one does now)."""
    values = [Int8(burst), Int8(shards), Float8(per_s), Int8(0), tenant_id, key]
    row = execute(_bucket_wait_sql(), values).fetchone()
    return max(float(row[0]), 0.0) if row and row[0] is not None else 0.0


# The flow keys an intent names (``key:<flow_key>``): one set of rows per distinct value, so
# the idle ones are pruned (``ledger.services.authority.flow.flow_keys_prune``).
INTENT_KEYS = "key:%"


@cache
def _slots_prune_sql() -> str:
    slots = _table(FlowSlot)
    # A key is idle when none of its places is held or was taken since the cutoff; its free
    # places are removed (a dispatch locking one is passed over, and keeps it). Removing a free
    # place never lets a key hold more than its limit: slots_open makes the missing ones again.
    return (
        f"DELETE FROM {slots} s WHERE s.operation_id IS NULL AND s.id IN ("
        f"SELECT f.id FROM {slots} f WHERE f.key LIKE %s AND f.operation_id IS NULL "
        "AND (f.taken_at IS NULL OR f.taken_at < %s) "
        f"AND NOT EXISTS (SELECT 1 FROM {slots} g WHERE g.tenant_id = f.tenant_id AND g.key = f.key "
        "AND (g.operation_id IS NOT NULL OR g.taken_at >= %s)) "
        "ORDER BY f.id LIMIT %s FOR UPDATE SKIP LOCKED)"
    )


def slots_prune(*, cutoff: datetime, batch: int) -> int:
    """Remove up to ``batch`` places of idle intent-named keys (none held, none taken since
    ``cutoff``); how many were removed."""
    return execute(_slots_prune_sql(), [INTENT_KEYS, cutoff, cutoff, Int8(batch)]).rowcount


@cache
def _buckets_prune_sql() -> str:
    buckets = _table(FlowBucket)
    # A shard untouched since the cutoff is full (the caller's cutoff is at least the time a
    # shard takes to fill): removing it gives nothing back that buckets_open would not.
    return (
        f"DELETE FROM {buckets} b WHERE b.refilled_at < %s AND b.id IN ("
        f"SELECT f.id FROM {buckets} f WHERE f.tenant_id = %s AND f.key LIKE %s AND f.refilled_at < %s "
        "ORDER BY f.id LIMIT %s FOR UPDATE SKIP LOCKED)"
    )


def buckets_prune(*, tenant_id: object, cutoff: datetime, batch: int) -> int:
    """Remove up to ``batch`` shards of ``tenant_id``'s intent-named keys not taken from since
    ``cutoff``; how many were removed."""
    return execute(_buckets_prune_sql(), [cutoff, tenant_id, INTENT_KEYS, cutoff, Int8(batch)]).rowcount


def bucket_tenants() -> list[int]:
    """The tenants with a shard of an intent-named key."""
    return [
        int(pk)
        for pk in FlowBucket.objects.filter(key__startswith="key:").values_list("tenant_id", flat=True).distinct()
    ]
