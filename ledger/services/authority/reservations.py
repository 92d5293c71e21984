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

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, F, Sum, Value
from django.db.models.functions import Least
from django.utils import timezone

from ledger.actors import SYSTEM_RESERVATION_EXPIRY
from ledger.errors import Denied, InvalidInput, WrongPhase
from ledger.models import CostReservation, CostWindow, Operation, Run, Tenant
from ledger.services.authority.breaker import OVERAGE_REASON, breaker_update
from ledger.services.authority.policy import policy_current
from ledger.services.authority.windows import budget_refusal, budgets_for, window_charge, window_name, windows_ensure
from ledger.services.core.fencing import locked_runs
from ledger.services.evidence.append import ChainBatch
from ledger.states import ReservationState

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
    *, op: Operation, run: Run, policy: dict, batch: ChainBatch, actor: str, now: datetime
) -> CostReservation | None:
    """Reserve ``op``'s worst-case estimate for its current attempt on every applicable
    budget key, all or nothing, at dispatch. Called with the run locked.

    Returns None when the operation states no estimate and no limit applies; refuses
    (``Denied("DENY_BUDGET", budget="estimate")``) a missing estimate where a limit
    applies, and ``Denied("DENY_BUDGET", budget="<kind>:cents")`` naming the first budget
    (in window order) without room. The same attempt reserved again, by a duplicate message
    or a replayed dispatch, gets the reservation it already has: never a second charge."""
    tenant = run.tenant
    budgets = budgets_for(op=op, run=run, tenant=tenant, policy=policy)
    estimate = op.estimated_cost_cents
    if estimate is None:
        if budgets:
            raise Denied(
                "DENY_BUDGET",
                f"the {budgets[0].label} is limited: the operation must state estimated_cost_cents, its worst-case cost",
                budget="estimate",
            )
        return None
    if estimate < 0:
        raise InvalidInput("estimated_cost_cents must be zero or more")
    existing = CostReservation.objects.filter(operation=op, attempt=op.attempt).first()
    if existing is not None:
        return existing
    windows = windows_ensure(tenant=tenant, budgets=budgets, now=now, window_s=policy["cost_window_s"])
    try:
        with transaction.atomic():  # the all-or-nothing part: a refusal takes back every key
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
            for budget, window in sorted(zip(budgets, windows, strict=True), key=lambda pair: pair[1].pk):
                if not window_charge(window, estimate):
                    raise budget_refusal(budget, window, estimate)
            CostReservation.windows.through.objects.bulk_create(
                [CostReservation.windows.through(costreservation=reservation, costwindow=w) for w in windows]
            )
    except IntegrityError:
        # The same (operation, attempt) was reserved at this moment by another transaction.
        existing = CostReservation.objects.filter(operation=op, attempt=op.attempt).first()
        if existing is None:
            raise
        return existing
    batch.append(
        run,
        "COST_RESERVED",
        actor=actor,
        fields={
            "reservation_id": reservation.pk,
            "operation_id": op.pk,
            "attempt": op.attempt,
            "estimated_cents": estimate,
            "keys": [b.name for b in budgets],
        },
    )
    breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now)
    return reservation


def _current_reservation(op: Operation) -> CostReservation | None:
    """The reservation of ``op``'s current attempt, locked. An operation without an
    estimate never has one (``cost_reserve`` reserves nothing without it): no statement."""
    if op.estimated_cost_cents is None:
        return None
    return CostReservation.objects.select_for_update(of=("self",)).filter(operation=op, attempt=op.attempt).first()


def cost_settle(
    *, op: Operation, run: Run, actual_cents: int | None, batch: ChainBatch, actor: str, now: datetime
) -> None:
    """The outcome CONFIRMED or FAILED of ``op``'s current attempt was recorded.

    With ``actual_cents``: the reservation settles (RELEASED when it is 0), in one UPDATE
    per reservation that takes the estimate out of ``reserved`` and puts the actual cost
    into ``settled`` at once, so no state between "settled" and "released" ever exists.
    A reservation that had gone UNKNOWN (it expired before the report came) settles the
    same way: this is the late usage it was waiting for. An actual cost above the room of
    a window is an overage (see the module docstring).

    Without it (the provider sent no usage): the reservation becomes UNKNOWN, its estimate
    still counted, until reconciliation settles it."""
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
    _close(reservation, amount=actual_cents, op=op, run=run, batch=batch, actor=actor, now=now, via="outcome")


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
) -> None:
    """RESERVED / UNKNOWN -> SETTLED (amount > 0) or RELEASED (amount 0)."""
    source = ReservationState(reservation.state)
    target = ReservationState.SETTLED if amount > 0 else ReservationState.RELEASED
    if target not in RESERVATION_TRANSITIONS[source]:
        raise WrongPhase(phase=f"reservation {source}", wanted="RESERVED or UNKNOWN")
    won = CostReservation.objects.filter(pk=reservation.pk, state=source).update(
        state=target, actual_cents=amount, closed_at=now
    )
    if won != 1:  # impossible while the reservation row is locked
        raise WrongPhase(phase="reservation changed concurrently", wanted=source)
    estimate = reservation.estimated_cents
    windows = list(CostWindow.objects.select_for_update(of=("self",)).filter(reservations=reservation).order_by("pk"))
    overage = {}
    for window in windows:
        room = window.limit_cents - window.settled_cents - window.reserved_cents + estimate
        if amount > room:
            overage[window_name(window)] = amount - room
    if windows:
        # One statement for every window: SET expressions all read the old row, so the
        # estimate leaves and the actual cost (up to the room) enters in the same instant.
        CostWindow.objects.filter(pk__in=[w.pk for w in windows]).update(
            reserved_cents=F("reserved_cents") - estimate,
            settled_cents=F("settled_cents")
            + Least(
                Value(amount),
                F("limit_cents") - F("settled_cents") - F("reserved_cents") + estimate,
                output_field=BigIntegerField(),
            ),
        )
    reservation.state, reservation.actual_cents, reservation.closed_at = target, amount, now
    fields = {
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
    event_type = "COST_SETTLED" if target == ReservationState.SETTLED else "COST_RELEASED"
    batch.append(run, event_type, actor=actor, fields=fields)
    tenant = run.tenant
    _, policy = policy_current(tenant=tenant)
    forced = None
    if overage:
        forced = (
            f"{OVERAGE_REASON}operation {op.pk} attempt {reservation.attempt} cost {amount} cents, "
            f"estimated {estimate}; over by up to {max(overage.values())} on {', '.join(sorted(overage))}"
        )
    breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now, forced_open=forced)


def cost_mark_unknown(
    *, ops: list[Operation], runs: dict, batch: ChainBatch, actor: str, now: datetime, reason: str
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
    reservations: list[CostReservation], *, runs: dict, batch: ChainBatch, actor: str, now: datetime, reason: str
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
    first_run_of: dict = {}
    for reservation in reservations:
        reservation.state = ReservationState.UNKNOWN
        run = runs[reservation.run_id]
        first_run_of.setdefault(reservation.tenant_id, run)
        batch.append(
            run,
            "COST_UNKNOWN",
            actor=actor,
            fields={
                "reservation_id": reservation.pk,
                "operation_id": reservation.operation_id,
                "attempt": reservation.attempt,
                "from": ReservationState.RESERVED.value,
                "to": ReservationState.UNKNOWN.value,
                "estimated_cents": reservation.estimated_cents,
                "reason": reason,
            },
        )
    tenants = Tenant.objects.in_bulk(list(first_run_of))
    for tenant_id in sorted(first_run_of):  # one order for every caller: no lock cycles
        tenant = tenants[tenant_id]
        _, policy = policy_current(tenant=tenant)
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
    breaker. Returns how many reservations became UNKNOWN."""
    batch_size = batch_size or settings.FENCELINE["RESERVATION_EXPIRY_BATCH_SIZE"]
    result = ExpiryResult()
    while True:
        with transaction.atomic():
            now = timezone.now()
            due = list(
                CostReservation.objects.filter(state=ReservationState.RESERVED, expires_at__lte=now)
                .order_by("expires_at")
                .values_list("run_id", flat=True)[:batch_size]
            )
            if not due:
                break
            runs = {run.pk: run for run in locked_runs({"run_id__in": set(due)}, skip_locked=True)}
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
        if not moved:
            break  # what is due belongs to runs busy right now: the next pass takes it
        result.reservations += moved
        result.batches += 1
        if progress is not None:
            progress(result)
        if len(due) < batch_size:
            break  # every due reservation was in this batch (those of busy runs wait)
    return result.reservations


def window_reconciles(window: CostWindow) -> bool:
    """The ledger check of the article for one window: its ``reserved_cents`` is exactly the
    sum of the estimates of its reservations still open (RESERVED or UNKNOWN)."""
    open_sum = (
        CostReservation.objects.filter(windows=window, state__in=OPEN_RESERVATION_STATES).aggregate(
            total=Sum("estimated_cents")
        )["total"]
        or 0
    )
    return CostWindow.objects.filter(pk=window.pk).values_list("reserved_cents", flat=True).get() == open_sum
