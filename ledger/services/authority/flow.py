"""Flow control at dispatch: the tenant policy's concurrency limits and rate limits.

    "concurrency": {"tenant": 20, "tool:email": 4, "key:*": 1}
    "rate_limits": {"provider:stripe": {"per_s": 5, "burst": 10}}

An operation is limited by each configured key that names it: ``tenant`` (every operation
of the tenant), ``tool:<its tool>``, ``provider:<its provider>`` and, when its intent names
a ``flow_key``, ``key:<flow_key>`` — or, when that exact key is not configured, ``key:*``,
which limits each distinct flow_key value on its own.

**Concurrency** (N): at most N operations DISPATCHED at once under the key. A dispatch takes
one of the key's N places (:class:`~ledger.models.FlowSlot`) in its own transaction; the
database gives the place back in the statement that moves the operation out of DISPATCHED —
CONFIRMED, FAILED or UNKNOWN, by its worker, by a lease's end (expiry, takeover, revocation,
restore) or a cancel's grace — by the trigger ``flowslot_release``, so no path can keep it.
The rule: *a place is held exactly while its operation is DISPATCHED*. Places count the
dispatches made under the limit: lowering N leaves the places already held until they are
given back; an operation dispatched before the limit existed holds none.

**Rate** (per_s R, burst B): a token bucket per key, sharded like the cost escrow
(``ledger/sql/flow.py``: n = min(FLOW_BUCKET_SHARDS, B) shards, refilled lazily by the
database's clock in the UPDATE that takes a token). A dispatch takes one whole token, from
the shard its run hashes to or the next one that has one; it is refused only when no shard
has one. Over any stretch of time t since the bucket opened it admits at most B + R·t, and
when it refuses, fewer than n tokens (less than one per shard) were left unused.

A refusal is 409 THROTTLED naming the key, with ``retry_after_s``: nothing is decided or
recorded (the dispatch's transaction rolls back, its cost reservation and any place or token
it took with it), and the operation stays AUTHORIZED, so the same dispatch may be sent again.
Unlike a budget refusal (DENY_BUDGET moves the operation to DENIED: the budget is spent
until its window ends), a throttle is a matter of moments. Keys are taken in sorted order,
places before tokens, after the cost reservation: every dispatch locks in the same order.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction

from ledger.errors import Throttled
from ledger.models import Operation, Tenant
from ledger.observability import metrics
from ledger.policy import PolicyDocument, flow_key_kind, flow_limits_of
from ledger.services.authority.policy import policy_current
from ledger.services.authority.windows import run_shard_hash
from ledger.sql import flow as sql_flow
from ledger.versioning import CURRENT_SCHEMA_VERSION


@dataclass(frozen=True)
class FlowLimit:
    """One configured limit on an operation: its key as stored (``key:acme-42`` for a
    ``key:*`` entry), the key's kind, and the limit (places, or per_s and burst)."""

    key: str
    kind: str
    places: int = 0
    per_s: float = 0.0
    burst: int = 0


def keys_of(op: Operation) -> list[str]:
    """The flow keys that name ``op``."""
    keys = ["tenant", f"tool:{op.tool}"]
    if op.provider:
        keys.append(f"provider:{op.provider}")
    if op.flow_key:
        keys.append(f"key:{op.flow_key}")
    return keys


def _entry(limits: dict[str, Any], key: str) -> Any:
    """The policy's limit for ``key``: its own entry, else (for a flow_key) ``key:*``'s."""
    if key in limits:
        return limits[key]
    return limits.get("key:*") if key.startswith("key:") else None


def limits_for(op: Operation, policy: PolicyDocument) -> tuple[list[FlowLimit], list[FlowLimit]]:
    """The (concurrency, rate) limits of ``policy`` on ``op``, each in key order."""
    concurrency, rates = flow_limits_of(policy)
    places, buckets = [], []
    for key in sorted(keys_of(op)):
        kind = flow_key_kind(key) or "key"
        if (n := _entry(concurrency, key)) is not None:
            places.append(FlowLimit(key=key, kind=kind, places=n))
        if (rate := _entry(rates, key)) is not None:
            buckets.append(FlowLimit(key=key, kind=kind, per_s=float(rate["per_s"]), burst=rate["burst"]))
    return places, buckets


def shards_of(limit: FlowLimit) -> int:
    """How many shards ``limit``'s bucket has: every shard holds at least one whole token."""
    shards: int = settings.FENCELINE["FLOW_BUCKET_SHARDS"]
    return max(1, min(shards, limit.burst))


def flow_take(*, op: Operation, tenant: Tenant, policy: PolicyDocument, now: datetime) -> None:
    """Take a place of every concurrency limit and a token of every rate limit on ``op``,
    inside the dispatch's transaction; raise Throttled (which rolls it all back) naming the
    first key with no room."""
    places, buckets = limits_for(op, policy)
    for limit in places:
        if not _place(op, tenant, limit, now):
            wait = settings.FENCELINE["FLOW_CONCURRENCY_RETRY_AFTER_S"]
            raise _throttled(
                tenant,
                limit,
                "concurrency",
                wait,
                f"{limit.key!r} has {limit.places} operations in flight already (its concurrency limit)",
            )
    for limit in buckets:
        if not _token(op, tenant, limit):
            wait_s = sql_flow.bucket_wait_s(
                tenant_id=tenant.pk, key=limit.key, burst=limit.burst, shards=shards_of(limit), per_s=limit.per_s
            )
            raise _throttled(
                tenant,
                limit,
                "rate",
                max(1, math.ceil(wait_s)),
                f"{limit.key!r} is over its rate limit ({limit.per_s:g} per second, burst {limit.burst})",
            )


def _place(op: Operation, tenant: Tenant, limit: FlowLimit, now: datetime) -> bool:
    def take() -> bool:
        return sql_flow.slot_take(tenant_id=tenant.pk, key=limit.key, places=limit.places, operation_id=op.pk, now=now)

    if take():
        return True
    # The places missing (first use, or a raised limit); one opened by a dispatch still in
    # progress is waited for, then taken or found held.
    sql_flow.slots_open(tenant_id=tenant.pk, key=limit.key, places=limit.places, version=CURRENT_SCHEMA_VERSION)
    return take()


def _token(op: Operation, tenant: Tenant, limit: FlowLimit) -> bool:
    shards = shards_of(limit)
    home = run_shard_hash(op.run_id) % shards

    def take(wait: bool) -> bool:
        # In a savepoint, rolled back when no token was taken: the shards the statement
        # found empty after waiting are locked by it, and must not stay locked while this
        # dispatch waits for another shard (two such waits would deadlock).
        savepoint = transaction.savepoint_create()
        taken = sql_flow.bucket_take(
            tenant_id=tenant.pk,
            key=limit.key,
            burst=limit.burst,
            shards=shards,
            per_s=limit.per_s,
            home=home,
            wait=wait,
        )
        if taken:
            transaction.savepoint_commit(savepoint)
        else:
            transaction.savepoint_rollback(savepoint)
        return taken

    # First without waiting for a shard another dispatch holds, then waiting: a refusal
    # means every shard, read after its lock was free, had less than one token.
    if take(False) or take(True):
        return True
    sql_flow.buckets_open(
        tenant_id=tenant.pk, key=limit.key, burst=limit.burst, shards=shards, version=CURRENT_SCHEMA_VERSION
    )
    return take(True)


def _throttled(tenant: Tenant, limit: FlowLimit, which: str, retry_after_s: int, detail: str) -> Throttled:
    metrics.count(metrics.FLOW_THROTTLED.labels(tenant.slug, limit.kind, which).inc)
    return Throttled(detail, retry_after_s=retry_after_s, key=limit.key, limit=which)


@dataclass(frozen=True)
class Pruned:
    places: int = 0
    shards: int = 0


def flow_keys_prune(*, now: datetime, idle_s: int | None = None, batch: int | None = None) -> Pruned:
    """Remove the flow-control rows of intent-named keys (``key:<flow_key>``: one set per
    distinct value, created on first use) idle for ``idle_s`` (FENCELINE["FLOW_KEY_IDLE_S"]):
    a concurrency key's places when none is held or was taken since, a rate key's shards
    not taken from since (and never before they are full again under the tenant's current
    ``key:*`` rate, so a key used again starts as it would have). In bounded batches, each
    its own transaction, passing over rows a dispatch holds; running it again removes
    nothing more. The retention job's second step (``manage.py retention``)."""
    idle = timedelta(seconds=idle_s if idle_s is not None else settings.FENCELINE["FLOW_KEY_IDLE_S"])
    size = batch or settings.FENCELINE["RETENTION_BATCH_SIZE"]
    places = _in_batches(partial(sql_flow.slots_prune, cutoff=now - idle, batch=size), size)
    shards = 0
    for tenant_id in sql_flow.bucket_tenants():
        cutoff = now - max(idle, _refill_time(Tenant.objects.get(pk=tenant_id)))
        shards += _in_batches(partial(sql_flow.buckets_prune, tenant_id=tenant_id, cutoff=cutoff, batch=size), size)
    return Pruned(places=places, shards=shards)


def _refill_time(tenant: Tenant) -> timedelta:
    """The longest an intent-named key's shard takes to fill again under the tenant's
    current rate limits (burst plus a token per shard, at per_s)."""
    _, rates = flow_limits_of(policy_current(tenant=tenant)[1])
    slowest = 0.0
    for key, rate in rates.items():
        if key.startswith("key:"):
            slowest = max(slowest, (rate["burst"] + settings.FENCELINE["FLOW_BUCKET_SHARDS"]) / rate["per_s"])
    return timedelta(seconds=math.ceil(slowest))


def _in_batches(step: Callable[[], int], size: int) -> int:
    removed = 0
    while True:
        with transaction.atomic():
            n = step()
        removed += n
        if n < size:
            return removed
