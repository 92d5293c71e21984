"""Cost budgets and the tenant's cost circuit breaker (article "Your AI Agent Needs a Cost
Circuit Breaker, Not a Monthly Budget").

**Budgets.** An operation's worst-case estimate is reserved before dispatch on every
budget key that applies to it, all or nothing:

    RUN       key = the run id          policy cost_limits_cents.run
    TENANT    key = the tenant slug     policy cost_limits_cents.tenant
    PROVIDER  key = operation.provider  policy cost_limits_cents.provider[<provider>], if listed
    RETRY     key = the operation id    policy cost_limits_cents.retry, from attempt 2 on

A key whose limit is null is not limited and has no window. A limited key has one
:class:`~ledger.models.CostWindow` per window of ``cost_window_s`` seconds, aligned to the
Unix epoch, created on first use with the limit the policy has at that moment (a later
policy change applies from the next window). Each window is charged with one conditional
UPDATE (``reserved + settled + estimate <= limit``): the row count decides, nobody reads a
balance and writes it back, and the check constraint ``costwindow_within_limit`` refuses
anything that would still get past (invariant 7). A reservation is never shrunk to what
is left: it is granted whole on every key or refused naming the key that refused.

**Reservations** (one per operation and attempt, the unique constraint
``reservation_one_per_attempt``) move along :data:`RESERVATION_TRANSITIONS`:

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
OPEN with a reason starting ``overage:``. That OPEN sticks until the window in which it
was opened ends: an estimate proved wrong, so no new work starts on estimates of the
same kind until somebody looks (or the window turns). Invariant 7 and the sum "settled
== sum of settled actuals" differ exactly by the recorded overages.

**Breaker.** The tenant's state is computed from its current TENANT window,
``(reserved + settled) / limit`` against the policy's thresholds, and from its UNKNOWN
reservations. Precedence, strongest first (:data:`BREAKER_PRECEDENCE`):

    OPEN       share >= open_at, a zero limit, or an overage in this window: new work refused
    UNKNOWN    some reservation of the tenant is UNKNOWN: automatic retries refused until
               reconciled; new work is still held to the spend level underneath
    DEGRADED   share >= degraded_at: only PURE operations
    THROTTLED  share >= throttled_at: at most throttled_max_dispatched in flight
    NORMAL

OPEN wins over UNKNOWN because it already refuses everything UNKNOWN refuses. Without a
tenant limit the state is NORMAL, or UNKNOWN while reservations are UNKNOWN. The state is
re-evaluated by every service here that changes spend or certainty, in the caller's
transaction; a change is a conditional UPDATE of the tenant row and a BREAKER_CHANGED
event in the chain of the run whose action caused it.

Callers (authorize, dispatch, outcome, reconciliation, the lease reaper) hold the run and
its lease row locked and pass their :class:`~ledger.services.events.ChainBatch`; nothing
here commits. Windows are locked in primary-key order everywhere, so two reservations over
the same keys queue instead of deadlocking.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, F, Q, Sum, Value
from django.db.models.functions import Least
from django.db.models.lookups import LessThanOrEqual
from django.utils import timezone

from ledger.models import CostReservation, CostWindow, Operation, Run, Tenant
from ledger.services.errors import Denied, InvalidInput, WrongPhase
from ledger.services.events import ChainBatch
from ledger.services.fencing import locked_runs
from ledger.services.policy import policy_current
from ledger.states import BreakerState, BudgetKind, EffectClass, Phase, ReservationState

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SYSTEM_RESERVATION_EXPIRY = "system:reservation-expiry"
OVERAGE_REASON = "overage: "  # breaker_reason prefix of an OPEN that holds to the window's end

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

BREAKER_PRECEDENCE = (
    BreakerState.OPEN,
    BreakerState.UNKNOWN,
    BreakerState.DEGRADED,
    BreakerState.THROTTLED,
    BreakerState.NORMAL,
)


# --- budgets and windows --------------------------------------------------------------


def window_bounds(now: datetime, window_s: int) -> tuple[datetime, datetime]:
    """The window of ``window_s`` seconds (aligned to the Unix epoch) that contains ``now``."""
    span = timedelta(seconds=window_s)
    starts_at = EPOCH + ((now - EPOCH) // span) * span
    return starts_at, starts_at + span


@dataclass(frozen=True)
class Budget:
    """One limited budget key that applies to an operation."""

    kind: BudgetKind
    key: str
    limit_cents: int

    @property
    def name(self) -> str:
        return f"{self.kind.lower()}:{self.key}"

    @property
    def label(self) -> str:
        return {
            BudgetKind.RUN: "run budget",
            BudgetKind.TENANT: f"tenant budget for {self.key!r}",
            BudgetKind.PROVIDER: f"provider budget for {self.key!r}",
            BudgetKind.RETRY: "retry budget of this operation",
        }[self.kind]


def budgets_for(*, op: Operation, run: Run, tenant: Tenant, policy: dict) -> list[Budget]:
    """The limited budget keys ``op`` (its current attempt) is charged to."""
    limits = policy["cost_limits_cents"]
    budgets = []
    if limits["run"] is not None:
        budgets.append(Budget(BudgetKind.RUN, str(run.pk), limits["run"]))
    if limits["tenant"] is not None:
        budgets.append(Budget(BudgetKind.TENANT, tenant.slug, limits["tenant"]))
    if op.provider and limits["provider"].get(op.provider) is not None:
        budgets.append(Budget(BudgetKind.PROVIDER, op.provider, limits["provider"][op.provider]))
    if op.attempt > 1 and limits["retry"] is not None:
        budgets.append(Budget(BudgetKind.RETRY, str(op.pk), limits["retry"]))
    return budgets


def _windows_ensure(*, tenant: Tenant, budgets: list[Budget], now: datetime, window_s: int) -> list[CostWindow]:
    """The current window of each budget (in the order given), created when missing with
    INSERT ... ON CONFLICT DO NOTHING and read back, so concurrent first uses agree."""
    if not budgets:
        return []
    starts_at, ends_at = window_bounds(now, window_s)

    def fetch() -> dict[tuple[str, str], CostWindow]:
        which = Q()
        for budget in budgets:
            which |= Q(kind=budget.kind, key=budget.key)
        return {(w.kind, w.key): w for w in CostWindow.objects.filter(which, tenant=tenant, starts_at=starts_at)}

    found = fetch()
    missing = sorted((b for b in budgets if (b.kind, b.key) not in found), key=lambda b: (b.kind, b.key))
    if missing:
        CostWindow.objects.bulk_create(
            [
                CostWindow(
                    tenant=tenant,
                    kind=b.kind,
                    key=b.key,
                    starts_at=starts_at,
                    ends_at=ends_at,
                    limit_cents=b.limit_cents,
                )
                for b in missing
            ],
            ignore_conflicts=True,
        )
        found = fetch()
    return [found[(b.kind, b.key)] for b in budgets]


def _charge(window: CostWindow, estimate: int) -> bool:
    """The reservation SQL of the article, on one window; True when it was granted."""
    granted = (
        CostWindow.objects.filter(pk=window.pk)
        .filter(LessThanOrEqual(F("reserved_cents") + F("settled_cents") + estimate, F("limit_cents")))
        .update(reserved_cents=F("reserved_cents") + estimate)
    )
    return granted == 1


def _budget_refusal(budget: Budget, window: CostWindow, estimate: int) -> Denied:
    limit, reserved, settled = (
        CostWindow.objects.filter(pk=window.pk).values_list("limit_cents", "reserved_cents", "settled_cents").get()
    )
    left = max(limit - reserved - settled, 0)
    return Denied(
        "DENY_BUDGET",
        f"{budget.label} has {left} of {limit} cents left; this needs {estimate}",
        budget=f"{budget.kind.lower()}:cents",
    )


def _window_name(window: CostWindow) -> str:
    return f"{window.kind.lower()}:{window.key}"


# --- reservations -----------------------------------------------------------------------


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
    windows = _windows_ensure(tenant=tenant, budgets=budgets, now=now, window_s=policy["cost_window_s"])
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
            for budget, window in sorted(zip(budgets, windows), key=lambda pair: pair[1].pk):
                if not _charge(window, estimate):
                    raise _budget_refusal(budget, window, estimate)
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
    _breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now)
    return reservation


def _current_reservation(op: Operation) -> CostReservation | None:
    """The reservation of ``op``'s current attempt, locked."""
    return (
        CostReservation.objects.select_for_update(of=("self",))
        .filter(operation=op, attempt=op.attempt)
        .first()
    )


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
    windows = list(
        CostWindow.objects.select_for_update(of=("self",)).filter(reservations=reservation).order_by("pk")
    )
    overage = {}
    for window in windows:
        room = window.limit_cents - window.settled_cents - window.reserved_cents + estimate
        if amount > room:
            overage[_window_name(window)] = amount - room
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
    _breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now, forced_open=forced)


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
        _breaker_update(tenant=tenant, policy=policy, batch=batch, run=first_run_of[tenant_id], actor=actor, now=now)
    return moved


# --- the breaker ------------------------------------------------------------------------


def _spend_level(*, tenant: Tenant, policy: dict, now: datetime) -> tuple[BreakerState, str]:
    """The state the tenant's current TENANT window alone calls for, and why."""
    limit = policy["cost_limits_cents"]["tenant"]
    if limit is None:
        return BreakerState.NORMAL, "no tenant cost limit"
    starts_at, _ = window_bounds(now, policy["cost_window_s"])
    row = (
        CostWindow.objects.filter(tenant=tenant, kind=BudgetKind.TENANT, key=tenant.slug, starts_at=starts_at)
        .values_list("limit_cents", "reserved_cents", "settled_cents")
        .first()
    )
    used = 0
    if row is not None:
        limit, used = row[0], row[1] + row[2]
    thresholds = policy["breaker"]
    share = used / limit if limit else 1.0
    why = f"tenant window from {starts_at:%Y-%m-%d %H:%M}Z: {used} of {limit} cents reserved or settled ({share:.0%})"
    if limit == 0 or share >= thresholds["open_at"]:
        return BreakerState.OPEN, why
    if share >= thresholds["degraded_at"]:
        return BreakerState.DEGRADED, why
    if share >= thresholds["throttled_at"]:
        return BreakerState.THROTTLED, why
    return BreakerState.NORMAL, why


def _breaker_compute(
    *, tenant: Tenant, policy: dict, now: datetime, stored: tuple[str, str, datetime | None]
) -> tuple[BreakerState, str]:
    """The state the tenant's breaker should be in now, by BREAKER_PRECEDENCE."""
    state, reason, changed_at = stored
    starts_at, _ = window_bounds(now, policy["cost_window_s"])
    if state == BreakerState.OPEN and reason.startswith(OVERAGE_REASON) and changed_at and changed_at >= starts_at:
        return BreakerState.OPEN, reason  # an overage holds it OPEN until its window ends
    level, why = _spend_level(tenant=tenant, policy=policy, now=now)
    if level == BreakerState.OPEN:
        return level, why
    if CostReservation.objects.filter(tenant=tenant, state=ReservationState.UNKNOWN).exists():
        return BreakerState.UNKNOWN, f"cost reservations are UNKNOWN until reconciled; {why}"
    return level, why


def _stored_breaker(tenant: Tenant) -> tuple[str, str, datetime | None]:
    return (
        Tenant.objects.filter(pk=tenant.pk)
        .values_list("breaker_state", "breaker_reason", "breaker_changed_at")
        .get()
    )


def _breaker_update(
    *,
    tenant: Tenant,
    policy: dict,
    batch: ChainBatch,
    run: Run,
    actor: str,
    now: datetime,
    forced_open: str | None = None,
) -> str:
    for _ in range(3):
        stored = _stored_breaker(tenant)
        if forced_open is not None:
            state, reason = BreakerState.OPEN, forced_open[:300]
        else:
            state, reason = _breaker_compute(tenant=tenant, policy=policy, now=now, stored=stored)
            reason = reason[:300]
            if state == stored[0]:
                return state
        won = Tenant.objects.filter(pk=tenant.pk, breaker_state=stored[0], breaker_changed_at=stored[2]).update(
            breaker_state=state, breaker_reason=reason, breaker_changed_at=now
        )
        if won == 1:
            tenant.breaker_state, tenant.breaker_reason, tenant.breaker_changed_at = state, reason, now
            batch.append(
                run, "BREAKER_CHANGED", actor=actor, fields={"from": stored[0], "to": state.value, "reason": reason}
            )
            return state
        # Another transaction changed the breaker since we read it: read again, decide again.
    return _stored_breaker(tenant)[0]


def breaker_evaluate(*, tenant: Tenant, policy: dict, batch: ChainBatch, run: Run, actor: str, now: datetime) -> str:
    """Bring the tenant's breaker to the state its spend and certainty call for (see the
    module docstring); a change is a conditional UPDATE of the tenant row and a
    BREAKER_CHANGED event {from, to, reason} in ``run``'s chain. Returns the state."""
    return _breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now)


def breaker_allows(*, tenant: Tenant, op: Operation, policy: dict, attempt_is_retry: bool) -> Denied | None:
    """Read-only guard for authorize, dispatch and retry: the refusal to raise, or None.

    OPEN refuses new work; UNKNOWN refuses retries, and otherwise holds new work to the
    spend level of the current window; DEGRADED lets only PURE operations through;
    THROTTLED refuses once ``throttled_max_dispatched`` operations of the tenant are
    DISPATCHED. A state stored in an earlier window is recomputed (read-only) first: the
    window it was about has ended, and an OPEN breaker would otherwise never see the
    reservation that re-evaluates it."""
    now = timezone.now()
    stored = _stored_breaker(tenant)
    state, reason, changed_at = BreakerState(stored[0]), stored[1], stored[2]
    starts_at, _ = window_bounds(now, policy["cost_window_s"])
    if state != BreakerState.NORMAL and changed_at is not None and changed_at < starts_at:
        state, reason = _breaker_compute(tenant=tenant, policy=policy, now=now, stored=stored)
    if state == BreakerState.OPEN:
        return _breaker_refusal(f"the tenant's cost breaker is OPEN ({reason}): no new work until it closes")
    level = state
    if state == BreakerState.UNKNOWN:
        if attempt_is_retry:
            return _breaker_refusal(f"the tenant's cost breaker is UNKNOWN ({reason}): no automatic retry until then")
        level, reason = _spend_level(tenant=tenant, policy=policy, now=now)
        if level == BreakerState.OPEN:
            return _breaker_refusal(f"the tenant's cost budget is spent ({reason}): no new work")
    if level == BreakerState.DEGRADED and op.effect_class != EffectClass.PURE:
        return _breaker_refusal(
            f"the tenant's cost breaker is DEGRADED ({reason}): only PURE operations may run; this one is {op.effect_class}"
        )
    if level == BreakerState.THROTTLED:
        most = policy["breaker"]["throttled_max_dispatched"]
        in_flight = Operation.objects.filter(tenant=tenant, phase=Phase.DISPATCHED).exclude(pk=op.pk).values("pk")
        if in_flight[:most].count() >= most:
            return _breaker_refusal(
                f"the tenant's cost breaker is THROTTLED ({reason}): {most} operation(s) already in flight"
            )
    return None


def _breaker_refusal(detail: str) -> Denied:
    return Denied("DENY_BUDGET", detail, budget="tenant:breaker")


# --- the reservation timeout job ----------------------------------------------------------


@dataclass
class ExpiryResult:
    reservations: int = 0
    batches: int = 0


def reservations_expire(*, batch_size: int = 500, progress: Callable[[ExpiryResult], None] | None = None) -> int:
    """RESERVED reservations past ``expires_at`` become UNKNOWN: a worker that reserved and
    never reported (crashed, hung) must not hold budget silently, nor free it as if
    nothing had been spent. Bounded batches; each locks its runs with ``SKIP LOCKED``
    (a run busy in a dispatch or an outcome is left for the next pass, and two jobs at once
    split the work), claims their reservations with ``FOR UPDATE SKIP LOCKED``, moves them
    in one UPDATE and writes one COST_UNKNOWN event each, then re-evaluates each tenant's
    breaker. Returns how many reservations became UNKNOWN."""
    result = ExpiryResult()
    while True:
        with transaction.atomic():
            now = timezone.now()
            due = (
                CostReservation.objects.filter(state=ReservationState.RESERVED, expires_at__lte=now)
                .order_by("expires_at")
                .values_list("run_id", flat=True)[:batch_size]
            )
            due = list(due)
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

