"""Cost reservations: one per operation and attempt (the unique constraint
``reservation_one_per_attempt``), charged on every budget window that applies
(``ledger.services.authority.windows``), moving along :data:`RESERVATION_TRANSITIONS`:

    RESERVED -> SETTLED    usage reported (> 0): the estimate leaves ``reserved``, the
                           actual cost enters ``settled``, the difference is released
    RESERVED -> RELEASED   nothing was spent (actual 0, or reconciled as not happened)
    RESERVED -> UNKNOWN    usage missing, outcome UNKNOWN, lease lost, reservation expired:
                           the estimate stays counted as reserved until someone knows
    UNKNOWN  -> SETTLED / RELEASED   late usage, or reconciliation

**Overage.** A provider can bill more than the worst case we reserved. That money is spent,
so it is settled, but a window must never hold more than its limit (the check constraint
is invariant 7 and is not bent for anybody). Settling therefore puts
``min(actual, room)`` into each window, where ``room = limit - settled - reserved +
estimate`` is what the window can take once this reservation's estimate leaves it (at
least the estimate, so an actual cost up to the estimate always fits whole). The part
that did not fit is the overage: the reservation keeps the full ``actual_cents`` (the
charge stays attributable to its run and attempt), the COST_SETTLED event records
``overage_cents`` and the budgets it overran, each overrun window is left full (that
budget refuses everything else until the window ends), and the tenant's breaker goes
OPEN (``ledger.services.authority.breaker``). Invariant 7 and the sum "settled == sum of
settled actuals" differ exactly by the recorded overages.

Callers (dispatch, outcome, reconciliation, the lease reaper) hold the run and its lease
row locked and pass their :class:`~ledger.services.evidence.append.ChainBatch`; nothing
here commits. The reservation timeout job (``reservations_expire``) is the exception: it
claims its own runs.
"""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import BigIntegerField, Case, F, QuerySet, Sum, Value, When
from django.db.models.expressions import Combinable
from django.db.models.functions import Least
from django.utils import timezone

from ledger.actors import SYSTEM_RESERVATION_EXPIRY
from ledger.errors import Denied, InvalidInput, WrongPhase
from ledger.models import CapabilityBudget, CostReservation, CostShard, CostWindow, Operation, Run, Tenant
from ledger.pagination import past
from ledger.services.authority.breaker import OVERAGE_REASON, breaker_after_spend, breaker_update
from ledger.services.authority.policy import policy_now
from ledger.services.authority.windows import (
    ESCROWED_KINDS,
    Budget,
    budget_refusal,
    budgets_for,
    run_shard_hash,
    shard_charge,
    shard_of,
    shard_refill,
    window_bounds,
    window_charge,
    window_name,
    windows_ensure,
)
from ledger.services.core.fencing import RESERVATION_SEEN, runs_locked_for_sweep
from ledger.services.evidence.append import ChainBatch
from ledger.sql import costs as sql_costs
from ledger.states import BudgetKind, CapabilityStatus, ReservationState

RESERVATION_TRANSITIONS: dict[ReservationState, frozenset[ReservationState]] = {
    ReservationState.RESERVED: frozenset(
        {ReservationState.SETTLED, ReservationState.RELEASED, ReservationState.UNKNOWN}
    ),
    ReservationState.UNKNOWN: frozenset({ReservationState.SETTLED, ReservationState.RELEASED}),
    ReservationState.SETTLED: frozenset(),
    ReservationState.RELEASED: frozenset(),
}
# Reservations whose estimate still counts as reserved in their windows.
OPEN_RESERVATION_STATES = (ReservationState.RESERVED, ReservationState.UNKNOWN)


def cost_reserve(
    *,
    op: Operation,
    run: Run,
    policy: dict[str, Any],
    batch: ChainBatch,
    actor: str,
    now: datetime,
    capability: CapabilityBudget | None = None,
    fresh: bool = False,
    breaker_seen: tuple[str, str, datetime | None] | None = None,
) -> CostReservation | None:
    """Reserve ``op``'s worst-case estimate for its current attempt on every applicable
    budget key, all or nothing, at dispatch — and one call (and the payload bytes) of
    ``capability`` with it, when given. Called with the run locked.

    Returns None when the operation states no estimate and no limit applies; refuses
    (``Denied("DENY_BUDGET", budget="estimate")``) a missing estimate where a limit
    applies, ``Denied("DENY_BUDGET", budget="capability:calls"|"capability:bytes")`` when
    the capability is spent, and ``Denied("DENY_BUDGET", budget="<kind>:cents")`` naming the
    first budget (in window order) without room; a refusal leaves nothing charged. The same
    attempt reserved again, by a duplicate message or a replayed dispatch, gets the
    reservation it already has: never a second charge. ``fresh``: the caller knows none
    exists (an AUTHORIZED operation under its run's lock), so none is looked for.
    ``breaker_seen``: the tenant's breaker as stored, read in this transaction."""
    budgets = budgets_for(op=op, run=run, tenant=run.tenant, policy=policy)
    estimate = _estimate_of(op, budgets=budgets, capability=capability, now=now)
    if estimate is None:
        return None
    if not fresh:
        existing = CostReservation.objects.filter(operation=op, attempt=op.attempt).first()
        if existing is not None:
            return existing
    charged = None
    if fresh:
        charged = _reserve_at_once(
            op=op, run=run, policy=policy, budgets=budgets, estimate=estimate, now=now, capability=capability
        )
    if charged is None:
        reservation, created = _reserve_key_by_key(
            op=op, run=run, policy=policy, budgets=budgets, batch=batch, now=now, capability=capability
        )
        if not created:
            return reservation  # the same attempt, reserved at this moment by another transaction
        tenant_window = None
    else:
        reservation, tenant_window = charged
    _record_reserved(
        reservation,
        op=op,
        run=run,
        policy=policy,
        budgets=budgets,
        batch=batch,
        actor=actor,
        now=now,
        breaker_seen=breaker_seen if charged is not None else None,  # the statement read the tenant window
        tenant_window=tenant_window,
    )
    return reservation


def _record_reserved(
    reservation: CostReservation,
    *,
    op: Operation,
    run: Run,
    policy: dict[str, Any],
    budgets: list[Budget],
    batch: ChainBatch,
    actor: str,
    now: datetime,
    breaker_seen: tuple[str, str, datetime | None] | None,
    tenant_window: tuple[int, int] | None,
) -> None:
    """The COST_RESERVED event, then the tenant's breaker: with ``breaker_seen`` (the breaker
    as stored, and ``tenant_window`` as the one-statement charge left it) only if the spend
    level moved (``breaker_after_spend``), else evaluated in full."""
    batch.append(
        run,
        "COST_RESERVED",
        actor=actor,
        fields={
            "reservation_id": reservation.pk,
            "operation_id": op.pk,
            "attempt": op.attempt,
            "estimated_cents": reservation.estimated_cents,
            "keys": [b.name for b in budgets],
        },
    )
    tenant = run.tenant
    if breaker_seen is not None:
        breaker_after_spend(
            tenant=tenant,
            policy=policy,
            batch=batch,
            run=run,
            actor=actor,
            now=now,
            stored=breaker_seen,
            tenant_window=tenant_window,
        )
    else:
        breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now)


def _estimate_of(
    op: Operation, *, budgets: list[Budget], capability: CapabilityBudget | None, now: datetime
) -> int | None:
    """``op``'s estimate, refused when negative. None when it states none: refused where a
    limit applies, else only its capability call (if any) is spent, and nothing reserved."""
    estimate = op.estimated_cost_cents
    if estimate is None:
        if budgets:
            raise Denied(
                "DENY_BUDGET",
                f"the {budgets[0].label} is limited: the operation must state estimated_cost_cents, its worst-case cost",
                budget="estimate",
            )
        if capability is not None:
            capability_spend(capability=capability, op=op, now=now)
        return None
    if estimate < 0:
        raise InvalidInput("estimated_cost_cents must be zero or more")
    return estimate


def _reserve_key_by_key(
    *,
    op: Operation,
    run: Run,
    policy: dict[str, Any],
    budgets: list[Budget],
    batch: ChainBatch,
    now: datetime,
    capability: CapabilityBudget | None,
) -> tuple[CostReservation, bool]:
    """The path that opens what is missing and names a refusal: the windows first (they
    outlive a refusal: opened for this period either way), then the capability call and
    every key in one savepoint. Returns as :func:`_reserve_one_by_one`."""
    windows = windows_ensure(tenant=run.tenant, budgets=budgets, now=now, window_s=policy["cost_window_s"])
    with batch.savepoint():  # a refusal takes back every key and the capability call
        if capability is not None:
            capability_spend(capability=capability, op=op, now=now)
        return _reserve_one_by_one(op=op, run=run, policy=policy, budgets=budgets, windows=windows, now=now)


# The windows this process has seen in place, (tenant id, kind, key, starts_at): a hint, so
# that the first dispatch of a run (whose RUN window the period has not opened yet) takes the
# one-statement path too, instead of failing it and charging one by one. A window named here
# that is not there (its transaction rolled back) fails the statement, and the one-by-one
# path opens it: the hint is never needed for correctness.
_windows_seen: set[tuple[object, str, str, datetime]] = set()
_WINDOWS_SEEN_MAX = 100_000


def _windows_in_place(*, tenant: Tenant, budgets: list[Budget], now: datetime, window_s: int) -> None:
    """Open the current windows of ``budgets`` (``windows_ensure``) unless this process has
    seen them all in place already."""
    starts_at, _ = window_bounds(now, window_s)
    keys = [(tenant.pk, b.kind.value, b.key, starts_at) for b in budgets]
    if all(key in _windows_seen for key in keys):
        return
    windows_ensure(tenant=tenant, budgets=budgets, now=now, window_s=window_s)
    if len(_windows_seen) >= _WINDOWS_SEEN_MAX:
        _windows_seen.clear()
    _windows_seen.update(keys)


def capability_spend(*, capability: CapabilityBudget, op: Operation, now: datetime) -> None:
    """One call (and ``op``'s payload bytes) of ``capability``, conditional on what is left."""
    need = op.payload_bytes or 0
    spend = CapabilityBudget.objects.filter(
        pk=capability.pk,
        status=CapabilityStatus.ACTIVE,
        expires_at__gt=now,
        used_calls__lt=F("max_calls"),
    )
    if capability.max_bytes is not None:
        spend = spend.filter(used_bytes__lte=F("max_bytes") - need)
    if spend.update(used_calls=F("used_calls") + 1, used_bytes=F("used_bytes") + need) != 1:
        raise Denied(
            "DENY_BUDGET", f"the run's capability for {op.tool} was spent meanwhile", budget="capability:calls"
        )


def _reserve_one_by_one(
    *, op: Operation, run: Run, policy: dict[str, Any], budgets: list[Budget], windows: list[CostWindow], now: datetime
) -> tuple[CostReservation, bool]:
    """Charge every budget's window (or its escrow shard, refilled as it needs) in window
    order and record the reservation: ``(reservation, True)``; raises the refusal of the
    first budget without room (the caller's savepoint takes back the rest). When another
    transaction reserved the same attempt at this moment: ``(its reservation, False)``."""
    tenant = run.tenant
    estimate = op.estimated_cost_cents or 0
    try:
        with transaction.atomic():
            reservation = CostReservation.objects.create(
                tenant=tenant,
                run=run,
                operation=op,
                attempt=op.attempt,
                provider=op.provider,
                estimated_cents=estimate,
                state=ReservationState.RESERVED,
                created_at=now,
                expires_at=now + timedelta(seconds=policy["reservation_ttl_s"]),
            )
            shards = []
            pairs = list(zip(budgets, windows, strict=True))  # budgets_for lists them in lock order
            for budget, window in [p for p in pairs if not p[1].shard_count] + [p for p in pairs if p[1].shard_count]:
                if window.shard_count:
                    shard = shard_of(window, run.pk)
                    granted = shard_charge(window, shard, estimate)
                    shards.append(shard)
                else:
                    granted = window_charge(window, estimate)
                if not granted:
                    raise budget_refusal(budget, window, estimate)
            CostReservation.windows.through.objects.bulk_create(
                [CostReservation.windows.through(costreservation=reservation, costwindow=w) for w in windows]
            )
            if shards:
                CostReservation.shards.through.objects.bulk_create(
                    [CostReservation.shards.through(costreservation=reservation, costshard=s) for s in shards]
                )
    except IntegrityError:
        # The same (operation, attempt) was reserved at this moment by another transaction.
        existing = CostReservation.objects.filter(operation=op, attempt=op.attempt).first()
        if existing is None:
            raise
        return existing, False
    return reservation, True


# --- the hot path: every charge of a dispatch in one statement -----------------------------


def _reserve_at_once(
    *,
    op: Operation,
    run: Run,
    policy: dict[str, Any],
    budgets: list[Budget],
    estimate: int,
    now: datetime,
    capability: CapabilityBudget | None,
) -> tuple[CostReservation, tuple[int, int] | None] | None:
    """Every charge of a dispatch as one statement: each budget's window (found by its key,
    or its escrow shard for this run), the capability call, and — only when every one of
    them was granted — the reservation with its links. Returns it with the TENANT window's
    (limit, used) after this charge (None without a tenant budget); or None when something
    was not granted (a window missing or without room in this shard, the capability spent):
    what was charged is taken back here, and the caller charges one by one, which refills
    shards, creates windows and names the refusal. The windows are opened first, unless
    this process saw them in place (:func:`_windows_in_place`)."""
    _windows_in_place(tenant=run.tenant, budgets=budgets, now=now, window_s=policy["cost_window_s"])
    starts_at, _ = window_bounds(now, policy["cost_window_s"])
    tenant_at = next((i for i, b in enumerate(budgets) if b.kind == BudgetKind.TENANT), None)
    reservation = CostReservation(
        tenant_id=run.tenant_id,
        run=run,
        operation=op,
        attempt=op.attempt,
        provider=op.provider,
        estimated_cents=estimate,
        state=ReservationState.RESERVED,
        created_at=now,
        expires_at=now + timedelta(seconds=policy["reservation_ttl_s"]),
    )
    spend = None
    if capability is not None:
        spend = sql_costs.Spend(
            capability_id=capability.pk,
            payload_bytes=op.payload_bytes or 0,
            limited_bytes=capability.max_bytes is not None,
            now=now,
        )
    row = sql_costs.charge(
        keys=[sql_costs.Key(b.kind.value, b.key, b.kind in ESCROWED_KINDS) for b in budgets],
        tenant_id=run.tenant_id,
        starts_at=starts_at,
        estimate=estimate,
        run_hash=run_shard_hash(run.pk),
        spend=spend,
        reservation=reservation,
        tenant_at=tenant_at,
    )
    granted, charged, tenant_row = row[0], row[1 : 1 + 2 * len(budgets) + 1], row[1 + 2 * len(budgets) + 1 :]
    if not granted:
        _take_back(charged, budgets=budgets, estimate=estimate, capability=capability, need=op.payload_bytes or 0)
        return None
    reservation._state.adding, reservation._state.db = False, DEFAULT_DB_ALIAS
    tenant_window = None
    if tenant_at is not None:
        limit, used = tenant_row
        tenant_window = (limit, used + estimate)  # the statement read the window before its own charge
    return reservation, tenant_window


def _take_back(
    charged: sql_costs.Row, *, budgets: list[Budget], estimate: int, capability: CapabilityBudget | None, need: int
) -> None:
    """Undo the charges of a statement that did not get them all (their rows are locked by
    this transaction since)."""
    for index in range(len(budgets)):
        window_id, shard_id = charged[2 * index], charged[2 * index + 1]
        if window_id is not None:
            CostWindow.objects.filter(pk=window_id).update(reserved_cents=F("reserved_cents") - estimate)
        if shard_id is not None:
            CostShard.objects.filter(pk=shard_id).update(reserved_cents=F("reserved_cents") - estimate)
    if capability is not None and charged[-1]:
        CapabilityBudget.objects.filter(pk=capability.pk).update(
            used_calls=F("used_calls") - 1, used_bytes=F("used_bytes") - need
        )


def _current_reservation(op: Operation) -> CostReservation | None:
    """The reservation of ``op``'s current attempt, locked. An operation without an
    estimate never has one (``cost_reserve`` reserves nothing without it): no statement;
    neither for one the fence's locking statement read with it (reservations change only
    under the run's lock, which the caller holds)."""
    if op.estimated_cost_cents is None:
        return None
    found: tuple[int | None, CostReservation | None] = op.__dict__.get(RESERVATION_SEEN, (None, None))
    attempt, seen = found
    if attempt == op.attempt:
        return seen
    return CostReservation.objects.select_for_update(of=("self",)).filter(operation=op, attempt=op.attempt).first()


def cost_settle(
    *,
    op: Operation,
    run: Run,
    actual_cents: int | None,
    batch: ChainBatch,
    actor: str,
    now: datetime,
    policy: dict[str, Any] | None = None,
    breaker_seen: tuple[str, str, datetime | None] | None = None,
) -> None:
    """The outcome CONFIRMED or FAILED of ``op``'s current attempt was recorded.

    With ``actual_cents``: the reservation settles (RELEASED when it is 0), in one UPDATE
    per reservation that takes the estimate out of ``reserved`` and puts the actual cost
    into ``settled`` at once, so no state between "settled" and "released" ever exists.
    A reservation that had gone UNKNOWN (it expired before the report came) settles the
    same way: this is the late usage it was waiting for. An actual cost above the room of
    a window is an overage (see the module docstring).

    Without it (the provider sent no usage): the reservation becomes UNKNOWN, its estimate
    still counted, until reconciliation settles it. ``policy`` and ``breaker_seen``: the
    tenant's policy and breaker as the caller read them in this transaction, if it did."""
    if actual_cents is not None and actual_cents < 0:
        raise InvalidInput("actual_cost_cents must be zero or more")
    reservation = _current_reservation(op)
    if reservation is None:
        return
    if actual_cents is None:
        if reservation.state == ReservationState.RESERVED:
            _to_unknown([reservation], runs={run.pk: run}, batch=batch, actor=actor, now=now, reason="usage missing")
        return
    if reservation.state not in OPEN_RESERVATION_STATES:
        return  # already closed: a repeated report changes nothing
    _close(
        reservation,
        amount=actual_cents,
        op=op,
        run=run,
        batch=batch,
        actor=actor,
        now=now,
        via="outcome",
        policy=policy,
        breaker_seen=breaker_seen,
    )


def cost_resolve(
    *, op: Operation, run: Run, actual_cents: int | None, batch: ChainBatch, actor: str, now: datetime
) -> CostReservation | None:
    """Reconciliation of ``op``'s current attempt closes its UNKNOWN (or still RESERVED)
    reservation: ``actual_cents`` > 0 settles it; 0 releases it (pass 0 when the effect did
    not happen); None means the effect happened and its usage will never be known, so the
    worst-case estimate is what it cost. Returns the reservation, or None if it had none."""
    if actual_cents is not None and actual_cents < 0:
        raise InvalidInput("actual_cost_cents must be zero or more")
    reservation = _current_reservation(op)
    if reservation is None or reservation.state not in OPEN_RESERVATION_STATES:
        return reservation
    amount = reservation.estimated_cents if actual_cents is None else actual_cents
    _close(reservation, amount=amount, op=op, run=run, batch=batch, actor=actor, now=now, via="reconciliation")
    return reservation


def _close(
    reservation: CostReservation,
    *,
    amount: int,
    op: Operation,
    run: Run,
    batch: ChainBatch,
    actor: str,
    now: datetime,
    via: str,
    policy: dict[str, Any] | None = None,
    breaker_seen: tuple[str, str, datetime | None] | None = None,
) -> None:
    """RESERVED / UNKNOWN -> SETTLED (amount > 0) or RELEASED (amount 0)."""
    source = ReservationState(reservation.state)
    target = ReservationState.SETTLED if amount > 0 else ReservationState.RELEASED
    if target not in RESERVATION_TRANSITIONS[source]:
        raise WrongPhase(phase=f"reservation {source}", wanted="RESERVED or UNKNOWN")
    tenant = run.tenant
    if policy is None:
        policy = policy_now(tenant=tenant).document
    closed = _close_at_once(
        reservation, tenant_slug=tenant.slug, source=source, target=target, amount=amount, now=now, policy=policy
    )
    if closed is None:
        overage = _close_one_by_one(reservation, source=source, target=target, amount=amount, now=now)
    else:
        overage = {}
    estimate = reservation.estimated_cents
    reservation.state, reservation.actual_cents, reservation.closed_at = target, amount, now
    fields = _closed_fields(reservation, op=op, source=source, target=target, amount=amount, via=via, overage=overage)
    event_type = "COST_SETTLED" if target == ReservationState.SETTLED else "COST_RELEASED"
    batch.append(run, event_type, actor=actor, fields=fields)
    if overage:
        forced = (
            f"{OVERAGE_REASON}operation {op.pk} attempt {reservation.attempt} cost {amount} cents, "
            f"estimated {estimate}; over by up to {max(overage.values())} on {', '.join(sorted(overage))}"
        )
        breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now, forced_open=forced)
    elif breaker_seen is not None and closed is not None and source == ReservationState.RESERVED:
        # Nothing left UNKNOWN here: the spend level is all that can have moved.
        breaker_after_spend(
            tenant=tenant,
            policy=policy,
            batch=batch,
            run=run,
            actor=actor,
            now=now,
            stored=breaker_seen,
            tenant_window=closed[0],
        )
    else:
        breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now)


def _closed_fields(
    reservation: CostReservation,
    *,
    op: Operation,
    source: ReservationState,
    target: ReservationState,
    amount: int,
    via: str,
    overage: dict[str, int],
) -> dict[str, Any]:
    """The fields of the COST_SETTLED or COST_RELEASED event of a reservation closed with
    ``amount``, and its overage by window name, if any."""
    estimate = reservation.estimated_cents
    fields: dict[str, Any] = {
        "reservation_id": reservation.pk,
        "operation_id": op.pk,
        "attempt": reservation.attempt,
        "from": source.value,
        "to": target.value,
        "estimated_cents": estimate,
        "actual_cents": amount,
        "released_cents": max(estimate - amount, 0),
        "via": via,
    }
    if overage:
        fields["overage_cents"] = max(overage.values())
        fields["overage_keys"] = sorted(overage)
    return fields


def _close_one_by_one(
    reservation: CostReservation, *, source: ReservationState, target: ReservationState, amount: int, now: datetime
) -> dict[str, int]:
    """The reservation closed and its windows (and shards) settled, each locked and read
    first, so that an overage is measured: returns the overage by window name. A shard
    with less room than the amount takes headroom from its window, or the other shards,
    before anything is called an overage."""
    won = CostReservation.objects.filter(pk=reservation.pk, state=source).update(
        state=target, actual_cents=amount, closed_at=now
    )
    if won != 1:  # impossible while the reservation row is locked
        raise WrongPhase(phase="reservation changed concurrently", wanted=source)
    estimate = reservation.estimated_cents
    overage = {}
    direct = list(
        CostWindow.objects.select_for_update(of=("self",), no_key=True)
        .filter(reservations=reservation, shard_count=0)
        .order_by(LOCK_RANK, "key")
    )
    for window in direct:
        room = window.limit_cents - window.settled_cents - window.reserved_cents - window.escrowed_cents + estimate
        if amount > room:
            overage[window_name(window)] = amount - room
    if direct:
        _settle_rows(
            CostWindow.objects.filter(pk__in=[w.pk for w in direct]),
            estimate,
            amount,
            F("limit_cents") - F("escrowed_cents"),
        )
    shards = CostShard.objects.filter(reservations=reservation).select_related("window")
    for shard in sorted(shards, key=lambda s: (RANKS[s.window.kind], s.window.key)):
        window = shard.window
        if amount > shard.allotted_cents - shard.settled_cents - shard.reserved_cents + estimate:
            shard_refill(window, shard, amount - estimate)  # locks the window row, then the shard
        shard = CostShard.objects.select_for_update(of=("self",), no_key=True).get(pk=shard.pk)
        room = shard.allotted_cents - shard.settled_cents - shard.reserved_cents + estimate
        if amount > room:
            overage[window_name(window)] = amount - room
        _settle_rows(CostShard.objects.filter(pk=shard.pk), estimate, amount, F("allotted_cents"))
    return overage


def _settle_rows(
    rows: QuerySet[CostWindow] | QuerySet[CostShard], estimate: int, amount: int, capacity: Combinable
) -> None:
    """One statement for every row: SET expressions all read the old row, so the estimate
    leaves and the actual cost (up to the room: ``capacity`` less the rest) enters in the
    same instant."""
    rows.update(
        reserved_cents=F("reserved_cents") - estimate,
        settled_cents=F("settled_cents")
        + Least(
            Value(amount),
            capacity - F("settled_cents") - F("reserved_cents") + estimate,
            output_field=BigIntegerField(),
        ),
    )


def _close_at_once(
    reservation: CostReservation,
    *,
    tenant_slug: str,
    source: ReservationState,
    target: ReservationState,
    amount: int,
    now: datetime,
    policy: dict[str, Any],
) -> tuple[tuple[int, int] | None] | None:
    """The reservation closed and every window and shard it charged settled, in one
    statement, when the amount fits each of them whole (the common case: no overage).
    Returns (the tenant window of ``now`` as (limit, used) after it, or None without a
    tenant limit); None when something did not fit (taken back here: the caller goes one
    by one and measures the overage)."""
    tenant_limit = policy["cost_limits_cents"]["tenant"]
    tenant_window = None
    if tenant_limit is not None:
        starts_at, _ = window_bounds(now, policy["cost_window_s"])
        tenant_window = (reservation.tenant_id, BudgetKind.TENANT.value, tenant_slug, starts_at)
    pk = reservation.pk
    row = sql_costs.settle(
        reservation_id=pk,
        source=source.value,
        target=target.value,
        estimate=reservation.estimated_cents,
        amount=amount,
        now=now,
        tenant_window=tenant_window,
    )
    moved, windows, shards, want_windows, want_shards = row[:5]
    if moved != 1:  # impossible while the reservation row is locked
        raise WrongPhase(phase="reservation changed concurrently", wanted=source)
    windows, shards = windows or [], shards or []
    if len(windows) != want_windows or len(shards) != want_shards:
        CostReservation.objects.filter(pk=pk).update(state=source, actual_cents=None, closed_at=None)
        back = {"reserved_cents": F("reserved_cents") + reservation.estimated_cents}
        back["settled_cents"] = F("settled_cents") - amount
        if windows:
            CostWindow.objects.filter(pk__in=windows).update(**back)
        if shards:
            CostShard.objects.filter(pk__in=[shard for shard, _ in shards]).update(**back)
        return None
    if tenant_limit is None:
        return (None,)
    tenant_window, limit, used = row[5], row[6], row[7]
    if tenant_window is None:  # not opened in this window yet
        return ((tenant_limit, 0),)
    touched = tenant_window in windows or any(window == tenant_window for _, window in shards)
    # The statement read the window before its own change.
    return ((limit, used + (amount - reservation.estimated_cents if touched else 0)),)


# A window's place in the lock order: its budget kind, in the order budgets_for lists them.
RANKS: dict[str, int] = {
    kind.value: rank
    for rank, kind in enumerate((BudgetKind.RUN, BudgetKind.TENANT, BudgetKind.PROVIDER, BudgetKind.RETRY))
}
LOCK_RANK = Case(*(When(kind=kind, then=Value(rank)) for kind, rank in RANKS.items()), default=Value(len(RANKS)))


def cost_mark_unknown(
    *, ops: list[Operation], runs: dict[uuid.UUID, Run], batch: ChainBatch, actor: str, now: datetime, reason: str
) -> int:
    """The operations became UNKNOWN (worker reported UNKNOWN, lease lost, drain deadline):
    the RESERVED reservations of their current attempts become UNKNOWN in one UPDATE, still
    counted as reserved, with one COST_UNKNOWN event each. ``runs`` maps run id to the
    locked run. Returns how many reservations moved."""
    if not ops:
        return 0
    attempts = {op.pk: op.attempt for op in ops}
    candidates = (
        CostReservation.objects.select_for_update(of=("self",))
        .filter(operation_id__in=list(attempts), state=ReservationState.RESERVED)
        .order_by("pk")
    )
    reservations = [r for r in candidates if r.attempt == attempts[r.operation_id]]
    reason = str(getattr(reason, "value", reason))  # a CaseReason or plain text
    return _to_unknown(reservations, runs=runs, batch=batch, actor=actor, now=now, reason=reason)


def _to_unknown(
    reservations: list[CostReservation],
    *,
    runs: dict[uuid.UUID, Run],
    batch: ChainBatch,
    actor: str,
    now: datetime,
    reason: str,
) -> int:
    """RESERVED -> UNKNOWN for reservations locked by the caller (with their runs), then the
    breaker of each tenant concerned."""
    if not reservations:
        return 0
    ids = [r.pk for r in reservations]
    moved = CostReservation.objects.filter(pk__in=ids, state=ReservationState.RESERVED).update(
        state=ReservationState.UNKNOWN
    )
    if moved != len(ids):  # impossible while the rows are locked
        raise WrongPhase(phase="reservation changed concurrently", wanted=ReservationState.RESERVED)
    first_run_of: dict[int, Run] = {}
    entries = []
    for reservation in reservations:
        reservation.state = ReservationState.UNKNOWN
        run = runs[reservation.run_id]
        first_run_of.setdefault(reservation.tenant_id, run)
        fields = {
            "reservation_id": reservation.pk,
            "operation_id": reservation.operation_id,
            "attempt": reservation.attempt,
            "from": ReservationState.RESERVED.value,
            "to": ReservationState.UNKNOWN.value,
            "estimated_cents": reservation.estimated_cents,
            "reason": reason,
        }
        entries.append((run, fields))
    batch.append_many(entries, "COST_UNKNOWN", actor=actor)
    tenants = Tenant.objects.in_bulk(list(first_run_of))
    for tenant_id in sorted(first_run_of):  # one order for every caller: no lock cycles
        tenant = tenants[tenant_id]
        policy = policy_now(tenant=tenant).document
        breaker_update(tenant=tenant, policy=policy, batch=batch, run=first_run_of[tenant_id], actor=actor, now=now)
    return moved


# --- the reservation timeout job ----------------------------------------------------------


@dataclass
class ExpiryResult:
    reservations: int = 0
    batches: int = 0


def reservations_expire(
    *, batch_size: int | None = None, progress: Callable[[ExpiryResult], None] | None = None
) -> int:
    """RESERVED reservations past ``expires_at`` become UNKNOWN: a worker that reserved and
    never reported (crashed, hung) must not hold budget silently, nor free it as if
    nothing had been spent. Bounded batches; each locks its runs with ``SKIP LOCKED``
    (a run busy in a dispatch or an outcome is left for the next pass, and two jobs at once
    split the work), claims their reservations with ``FOR UPDATE SKIP LOCKED``, moves them
    in one UPDATE and writes one COST_UNKNOWN event each, then re-evaluates each tenant's
    breaker. When every run of a batch is busy, the next read starts past those
    reservations, in (expires_at, id) order, instead of ending the pass. Returns how many
    reservations became UNKNOWN."""
    batch_size = batch_size or settings.FENCELINE["RESERVATION_EXPIRY_BATCH_SIZE"]
    result = ExpiryResult()
    after: tuple[datetime, uuid.UUID] | None = None  # (expires_at, id) of the last due reservation whose run was busy
    restarted = False
    while True:
        with transaction.atomic():
            now = timezone.now()
            due_now = CostReservation.objects.filter(state=ReservationState.RESERVED, expires_at__lte=now)
            if after is not None:
                due_now = past(due_now, "expires_at", *after)
            due = list(due_now.order_by("expires_at", "pk").values_list("run_id", "expires_at", "pk")[:batch_size])
            if not due:
                break
            runs = {run.pk: run for run in runs_locked_for_sweep(run_ids={row[0] for row in due})}
            reservations = list(
                CostReservation.objects.select_for_update(of=("self",), skip_locked=True)
                .filter(run_id__in=list(runs), state=ReservationState.RESERVED, expires_at__lte=now)
                .order_by("expires_at")[:batch_size]
            )
            batch = ChainBatch(now)
            moved = _to_unknown(
                reservations,
                runs=runs,
                batch=batch,
                actor=SYSTEM_RESERVATION_EXPIRY,
                now=now,
                reason="reservation expired",
            )
            batch.commit()
        if not runs and len(due) == batch_size:
            # Every run of these is busy elsewhere (another copy of this job, `expire_reservations
            # --processes N`): read on past them, so that copies at once split the backlog.
            after = due[-1][1:]
            continue
        if not moved:
            break  # what is due belongs to runs busy right now: the next pass takes it
        result.reservations += moved
        result.batches += 1
        if progress is not None:
            progress(result)
        if len(due) < batch_size:
            if after is None or restarted:
                break  # every due reservation was in this batch (those of busy runs wait)
            # The end, reached by reading past busy runs: once more from the start, for what
            # the other copy's batches left (a run's reservations past its batch's limit).
            after, restarted = None, True
    return result.reservations


def window_reconciles(window: CostWindow) -> bool:
    """The ledger check of the article for one window: its reserved cents (its escrow
    shards' included) are exactly the sum of the estimates of its reservations still open
    (RESERVED or UNKNOWN)."""
    open_sum = (
        CostReservation.objects.filter(windows=window, state__in=OPEN_RESERVATION_STATES).aggregate(
            total=Sum("estimated_cents")
        )["total"]
        or 0
    )
    held: int = (
        CostWindow.objects.filter(pk=window.pk).with_totals().values_list("total_reserved_cents", flat=True).get()
    )
    return held == open_sum
