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

**Escrow.** A TENANT or PROVIDER window is shared by every run of the tenant; charged
directly, its row would be one lock that every dispatch and outcome of the tenant queues on.
When its limit is at least ``COST_ESCROW_MIN_CENTS`` it is created with ``COST_ESCROW_SHARDS``
escrow shards (:class:`~ledger.models.CostShard`) and charged through them: a run charges the
shard its id hashes to, with the same conditional UPDATE against the shard's allotment. A
shard that runs dry takes headroom from the window (``escrowed_cents``, with the window row
locked) and, once the window has none left, from the other shards (each locked in turn):
headroom moves, it is never made up, so the shards never hold more than the window's limit
together, and a reservation is refused only when the window as a whole has no room for it.
A small window stays one exact row (its limit is reached in a handful of reservations, where
escrow would buy nothing).
"""

import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.db.models.lookups import LessThanOrEqual

from ledger.errors import Denied
from ledger.models import CostShard, CostWindow, Operation, Run, Tenant
from ledger.states import BudgetKind

ESCROWED_KINDS = frozenset({BudgetKind.TENANT, BudgetKind.PROVIDER})

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


def budgets_for(*, op: Operation, run: Run, tenant: Tenant, policy: dict[str, Any]) -> list[Budget]:
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


def escrow_shards(budget: Budget) -> int:
    """How many escrow shards a new window of ``budget`` gets (0: charged directly)."""
    conf = settings.FENCELINE
    if budget.kind in ESCROWED_KINDS and budget.limit_cents >= conf["COST_ESCROW_MIN_CENTS"]:
        shards: int = conf["COST_ESCROW_SHARDS"]
        return shards
    return 0


def run_shard_hash(run_id: object) -> int:
    """A run's place among a window's shards, before ``% shard_count``: the same in every process."""
    return zlib.crc32(str(run_id).encode())


def windows_ensure(*, tenant: Tenant, budgets: list[Budget], now: datetime, window_s: int) -> list[CostWindow]:
    """The current window of each budget (in the order given), created when missing with
    INSERT ... ON CONFLICT DO NOTHING and read back, so concurrent first uses agree; an
    escrowed one with its shards (created the same way)."""
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
                    shard_count=escrow_shards(b),
                )
                for b in missing
            ],
            ignore_conflicts=True,
        )
        found = fetch()
        # The shards of the windows this call opened (a window another transaction opened
        # at this moment came with its shards, committed with it: these then conflict).
        opened = [found[(b.kind, b.key)] for b in missing]
        CostShard.objects.bulk_create(
            [CostShard(window=w, shard=n) for w in opened if w.shard_count for n in range(w.shard_count)],
            ignore_conflicts=True,
        )
    return [found[(b.kind, b.key)] for b in budgets]


def shard_of(window: CostWindow, run_id: object) -> CostShard:
    """The escrow shard ``run_id`` charges in an escrowed ``window``."""
    return CostShard.objects.get(window=window, shard=run_shard_hash(run_id) % window.shard_count)


def shard_charge(window: CostWindow, shard: CostShard, need: int) -> bool:
    """Charge ``need`` to ``shard`` (reserved), moving headroom to it first when it has too
    little: from the window, then from the other shards. False when the window as a whole
    has no room for it (nothing is then charged or moved)."""
    granted = (
        CostShard.objects.filter(pk=shard.pk)
        .filter(LessThanOrEqual(F("reserved_cents") + F("settled_cents") + need, F("allotted_cents")))
        .update(reserved_cents=F("reserved_cents") + need)
    )
    if granted:
        return True
    if not shard_refill(window, shard, need):
        return False
    return (
        CostShard.objects.filter(pk=shard.pk)
        .filter(LessThanOrEqual(F("reserved_cents") + F("settled_cents") + need, F("allotted_cents")))
        .update(reserved_cents=F("reserved_cents") + need)
    ) == 1


def shard_refill(window: CostWindow, shard: CostShard, need: int) -> bool:
    """Move headroom to ``shard`` until it has ``need`` free cents, or as much as the
    window has anywhere: the window row is locked first (one refill of a window at a time),
    then the shard; headroom comes from the window (a chunk, so that the next charges need
    no refill) and then from the other shards, each locked in primary-key order. Whoever
    holds a shard of this window waits for nothing of it but this row, so the order is
    acyclic — provided the row lock is FOR NO KEY UPDATE: a charger that linked its
    reservation to the window checks that foreign key at COMMIT with a KEY SHARE lock on
    the row, which FOR UPDATE would make wait for this refill while the refill waits for the
    charger's shard (a deadlock the N = 16 benchmark found). Whether the shard now has
    ``need`` free."""
    row: CostWindow = CostWindow.objects.select_for_update(of=("self",), no_key=True).get(pk=window.pk)
    mine = CostShard.objects.select_for_update(of=("self",), no_key=True).get(pk=shard.pk)
    free_here = mine.allotted_cents - mine.reserved_cents - mine.settled_cents
    if free_here >= need:
        return True  # another transaction refilled it while we waited
    short = need - free_here
    window_free = row.limit_cents - row.reserved_cents - row.settled_cents - row.escrowed_cents
    from_window = min(window_free, max(short, row.limit_cents // (4 * max(row.shard_count, 1))))
    wanted = max(short - from_window, 0)
    donors: list[tuple[int, int]] = []
    if wanted:
        for donor in (
            CostShard.objects.select_for_update(of=("self",), no_key=True)
            .filter(window=row)
            .exclude(pk=mine.pk)
            .order_by("pk")
        ):
            spare = donor.allotted_cents - donor.reserved_cents - donor.settled_cents
            if spare > 0:
                take = min(spare, wanted)
                donors.append((donor.pk, take))
                wanted -= take
                if not wanted:
                    break
    for donor_pk, take in donors:
        CostShard.objects.filter(pk=donor_pk).update(allotted_cents=F("allotted_cents") - take)
    moved = from_window + sum(take for _, take in donors)
    if from_window:
        CostWindow.objects.filter(pk=row.pk).update(escrowed_cents=F("escrowed_cents") + from_window)
    if moved:
        CostShard.objects.filter(pk=mine.pk).update(allotted_cents=F("allotted_cents") + moved)
    return free_here + moved >= need


def window_charge(window: CostWindow, estimate: int) -> bool:
    """The reservation SQL of the article, on one window; True when it was granted."""
    used = F("reserved_cents") + F("settled_cents") + F("escrowed_cents")
    granted: int = (
        CostWindow.objects.filter(pk=window.pk)
        .filter(LessThanOrEqual(used + estimate, F("limit_cents")))
        .update(reserved_cents=F("reserved_cents") + estimate)
    )
    return granted == 1


def window_used(window: CostWindow) -> tuple[int, int, int]:
    """(limit, reserved, settled) of ``window`` now, its shards' included."""
    row = CostWindow.objects.filter(pk=window.pk).with_totals()
    totals: tuple[int, int, int] = row.values_list("limit_cents", "total_reserved_cents", "total_settled_cents").get()
    return totals


def budget_refusal(budget: Budget, window: CostWindow, estimate: int) -> Denied:
    limit, reserved, settled = window_used(window)
    left = max(limit - reserved - settled, 0)
    return Denied(
        "DENY_BUDGET",
        f"{budget.label} has {left} of {limit} cents left; this needs {estimate}",
        budget=f"{budget.kind.lower()}:cents",
    )


def window_name(window: CostWindow) -> str:
    return f"{window.kind.lower()}:{window.key}"
