"""The tenant's cost circuit breaker (article "Your AI Agent Needs a Cost Circuit Breaker,
Not a Monthly Budget").

The tenant's state is computed from its current TENANT window, ``(reserved + settled) /
limit`` against the policy's thresholds, and from its UNKNOWN reservations. Precedence,
strongest first (:data:`BREAKER_PRECEDENCE`):

    OPEN       share >= open_at, a zero limit, or an overage in this window: new work refused
    UNKNOWN    some reservation of the tenant is UNKNOWN: automatic retries refused until
               reconciled; new work is still held to the spend level underneath
    DEGRADED   share >= degraded_at: only PURE operations
    THROTTLED  share >= throttled_at: at most throttled_max_dispatched in flight
    NORMAL

OPEN wins over UNKNOWN because it already refuses everything UNKNOWN refuses. Without a
tenant limit the state is NORMAL, or UNKNOWN while reservations are UNKNOWN. An overage
(``ledger.services.authority.reservations``) forces OPEN with a reason starting
``overage:``, and that OPEN holds until the window in which it was opened ends. The state
is re-evaluated by every service that changes spend or certainty, in the caller's
transaction; a change is a conditional UPDATE of the tenant row and a BREAKER_CHANGED
event in the chain of the run whose action caused it.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Sum
from django.utils import timezone

from ledger.errors import Denied
from ledger.models import RUN_IN_FLIGHT, CostReservation, CostWindow, Operation, Run, Tenant
from ledger.policy import contract_for, levers_of
from ledger.services.authority.windows import window_bounds
from ledger.services.evidence.append import ChainBatch
from ledger.states import BreakerState, BudgetKind, EffectClass, Phase, ReservationState

OVERAGE_REASON = "overage: "  # breaker_reason prefix of an OPEN that holds to the window's end

BREAKER_PRECEDENCE = (
    BreakerState.OPEN,
    BreakerState.UNKNOWN,
    BreakerState.DEGRADED,
    BreakerState.THROTTLED,
    BreakerState.NORMAL,
)


def _spend_level(*, tenant: Tenant, policy: dict[str, Any], now: datetime) -> tuple[BreakerState, str]:
    """The state the tenant's current TENANT window alone calls for, and why."""
    limit = policy["cost_limits_cents"]["tenant"]
    if limit is None:
        return BreakerState.NORMAL, "no tenant cost limit"
    starts_at, _ = window_bounds(now, policy["cost_window_s"])
    row = (
        CostWindow.objects.filter(tenant=tenant, kind=BudgetKind.TENANT, key=tenant.slug, starts_at=starts_at)
        .with_totals()
        .values_list("limit_cents", "total_reserved_cents", "total_settled_cents")
        .first()
    )
    used = 0
    if row is not None:
        limit, used = row[0], row[1] + row[2]
    return spend_level(limit=limit, used=used, policy=policy, starts_at=starts_at)


def spend_level(*, limit: int, used: int, policy: dict[str, Any], starts_at: datetime) -> tuple[BreakerState, str]:
    """The state ``used`` of ``limit`` cents in the tenant window from ``starts_at`` calls for."""
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
    *, tenant: Tenant, policy: dict[str, Any], now: datetime, stored: tuple[str, str, datetime | None]
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


def breaker_after_spend(
    *,
    tenant: Tenant,
    policy: dict[str, Any],
    batch: ChainBatch,
    run: Run,
    actor: str,
    now: datetime,
    stored: tuple[str, str, datetime | None],
    tenant_window: tuple[int, int] | None,
) -> str:
    """:func:`breaker_update` after a reservation or a settlement that changed no certainty,
    when the caller knows the breaker as stored (read in this transaction) and the TENANT
    window's (limit, used) after its own change (None: the policy sets no tenant limit).
    While the spend level it calls for is the state already stored (NORMAL, THROTTLED or
    DEGRADED: no overage holds it and no reservation is UNKNOWN, or it would say so),
    nothing can have changed: no statement. Otherwise the full evaluation decides."""
    state = stored[0]
    starts_at, _ = window_bounds(now, policy["cost_window_s"])
    if tenant_window is None:
        level = BreakerState.NORMAL if policy["cost_limits_cents"]["tenant"] is None else None
    else:
        level, _why = spend_level(limit=tenant_window[0], used=tenant_window[1], policy=policy, starts_at=starts_at)
    calm = (BreakerState.NORMAL, BreakerState.THROTTLED, BreakerState.DEGRADED)
    if level is not None and level == state and level in calm:
        return state
    return breaker_update(tenant=tenant, policy=policy, batch=batch, run=run, actor=actor, now=now)


def _stored_breaker(tenant: Tenant) -> tuple[str, str, datetime | None]:
    return (
        Tenant.objects.filter(pk=tenant.pk).values_list("breaker_state", "breaker_reason", "breaker_changed_at").get()
    )


def breaker_update(
    *,
    tenant: Tenant,
    policy: dict[str, Any],
    batch: ChainBatch,
    run: Run,
    actor: str,
    now: datetime,
    forced_open: str | None = None,
) -> str:
    """Bring the tenant's breaker to the state its spend and certainty call for (see the
    module docstring), or OPEN with the reason ``forced_open`` (an overage); a change is a
    conditional UPDATE of the tenant row and a BREAKER_CHANGED event {from, to, reason} in
    ``run``'s chain. Returns the state."""
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


def breaker_allows(
    *,
    tenant: Tenant,
    op: Operation,
    policy: dict[str, Any],
    attempt_is_retry: bool,
    stored: tuple[str, str, datetime | None] | None = None,
) -> Denied | None:
    """Read-only guard for authorize, dispatch and retry: the refusal to raise, or None.

    OPEN refuses new work; UNKNOWN refuses retries, and otherwise holds new work to the
    spend level of the current window; DEGRADED lets only PURE operations through;
    THROTTLED refuses once ``throttled_max_dispatched`` operations of the tenant are
    DISPATCHED. A state stored in an earlier window is recomputed (read-only) first: the
    window it was about has ended, and an OPEN breaker would otherwise never see the
    reservation that re-evaluates it. ``stored`` is the tenant's (state, reason, changed
    at) as the caller read it fresh in this transaction, if it did."""
    now = timezone.now()
    if stored is None:  # the caller did not read it with the policy (policy_now)
        stored = _stored_breaker(tenant)
    state, reason, changed_at = BreakerState(stored[0]), stored[1], stored[2]
    starts_at, _ = window_bounds(now, policy["cost_window_s"])
    if state != BreakerState.NORMAL and changed_at is not None and changed_at < starts_at:
        state, reason = _breaker_compute(tenant=tenant, policy=policy, now=now, stored=stored)
    if state == BreakerState.OPEN:
        return _breaker_refusal(f"the tenant's cost breaker is OPEN ({reason}): no new work until it closes")
    level: BreakerState = state
    if state == BreakerState.UNKNOWN:
        if attempt_is_retry:
            return _breaker_refusal(f"the tenant's cost breaker is UNKNOWN ({reason}): no automatic retry until then")
        level, reason = _spend_level(tenant=tenant, policy=policy, now=now)
        if level == BreakerState.OPEN:
            return _breaker_refusal(f"the tenant's cost budget is spent ({reason}): no new work")
    if level == BreakerState.DEGRADED:
        # The class the tool contract gives now, not a label the worker chose (an operation
        # of a tool without a contract keeps the class it was intended with).
        contract = contract_for(policy, op.tool, op.action)
        effect = contract["effect_class"] if contract is not None else op.effect_class
        if effect != EffectClass.PURE:
            source = "its tool contract says" if contract is not None else "this one is"
            return _breaker_refusal(
                f"the tenant's cost breaker is DEGRADED ({reason}): only PURE operations may run; {source} {effect}"
            )
    if level == BreakerState.THROTTLED:
        most = policy["breaker"]["throttled_max_dispatched"]
        # The tenant's DISPATCHED operations, from its runs' counters (kept under each run's
        # lock with every transition), over its unfinished runs in index run_may_be_in_flight.
        dispatched = Run.objects.filter(RUN_IN_FLIGHT, tenant=tenant).aggregate(n=Sum("n_dispatched"))["n"] or 0
        in_flight = dispatched - (1 if op.phase == Phase.DISPATCHED else 0)
        if in_flight >= most:
            return _breaker_refusal(
                f"the tenant's cost breaker is THROTTLED ({reason}): {most} operation(s) already in flight"
            )
    return None


def _breaker_refusal(detail: str) -> Denied:
    return Denied("DENY_BUDGET", detail, budget="tenant:breaker")


@dataclass(frozen=True)
class Levers:
    """What a dispatch hands the worker while the tenant's breaker is THROTTLED or DEGRADED
    (policy ``breaker.levers``): an output ceiling and cheaper choices, best first."""

    state: str
    max_output_tokens: int | None
    fallbacks: tuple[str, ...]


def breaker_levers(*, policy: dict[str, Any], state: str) -> Levers | None:
    """The levers ``policy`` sets for the breaker ``state``, or None (NORMAL, OPEN, UNKNOWN,
    or a state the policy sets none for)."""
    lever = levers_of(policy, state)
    if lever is None:
        return None
    return Levers(state=state, max_output_tokens=lever["max_output_tokens"], fallbacks=tuple(lever["fallbacks"]))


def breaker_after_dispatch(*, tenant: Tenant, seen: tuple[str, str, datetime | None] | None, now: datetime) -> str:
    """The breaker's state once a dispatch's reservation is in: the one the reservation moved
    it to (``breaker_update`` changed the tenant row in this transaction, at ``now``), else
    the one stored when the run was locked (``seen``), else the tenant object's."""
    if tenant.breaker_changed_at == now or seen is None:
        return str(tenant.breaker_state)
    return seen[0]
