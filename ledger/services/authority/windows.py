"""Cost budgets and their windows (article "Your AI Agent Needs a Cost Circuit Breaker, Not
a Monthly Budget").

An operation's worst-case estimate is reserved before dispatch on every budget key that
applies to it, all or nothing (``ledger.services.authority.reservations``):

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
Windows are locked in primary-key order everywhere, so two reservations over the same
keys queue instead of deadlocking.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import F, Q
from django.db.models.lookups import LessThanOrEqual

from ledger.errors import Denied
from ledger.models import CostWindow, Operation, Run, Tenant
from ledger.states import BudgetKind

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def windows_ensure(*, tenant: Tenant, budgets: list[Budget], now: datetime, window_s: int) -> list[CostWindow]:
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


def window_charge(window: CostWindow, estimate: int) -> bool:
    """The reservation SQL of the article, on one window; True when it was granted."""
    granted = (
        CostWindow.objects.filter(pk=window.pk)
        .filter(LessThanOrEqual(F("reserved_cents") + F("settled_cents") + estimate, F("limit_cents")))
        .update(reserved_cents=F("reserved_cents") + estimate)
    )
    return granted == 1


def budget_refusal(budget: Budget, window: CostWindow, estimate: int) -> Denied:
    limit, reserved, settled = (
        CostWindow.objects.filter(pk=window.pk).values_list("limit_cents", "reserved_cents", "settled_cents").get()
    )
    left = max(limit - reserved - settled, 0)
    return Denied(
        "DENY_BUDGET",
        f"{budget.label} has {left} of {limit} cents left; this needs {estimate}",
        budget=f"{budget.kind.lower()}:cents",
    )


def window_name(window: CostWindow) -> str:
    return f"{window.kind.lower()}:{window.key}"
