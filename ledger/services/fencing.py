"""The fence: every write that carries a fencing token goes through :func:`fenced`.

``fenced`` locks the run and its lease row in one statement (``SELECT ... FOR UPDATE``;
on SQLite the IMMEDIATE transaction holds the database write lock instead), checks the
token, owner and expiry under that lock, and only then runs the write, in the same
transaction. A refused write is counted on the run and leaves a STALE_TOKEN_REJECTED
event in its chain; the refusal is raised after that record has committed.
"""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ledger.models import Run, RunLease, Tenant, Worker
from ledger.services.errors import DomainError, NotFound, StaleToken
from ledger.services.events import ChainBatch, worker_actor

T = TypeVar("T")


def parse_id(raw: object, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        raise NotFound(f"{what} not found") from None


def locked_runs(queryset_filter: dict, *, skip_locked: bool = False, limit: int | None = None) -> list[Run]:
    """Runs with their leases, both rows locked (in one statement) until the transaction ends.

    The query starts from the lease so that the join to the run is an inner join, which
    ``FOR UPDATE`` can lock on both sides."""
    leases = (
        RunLease.objects.select_for_update(of=("self", "run"), skip_locked=skip_locked)
        .select_related("run")
        .filter(**queryset_filter)
        .order_by("expires_at")
    )
    if limit is not None:
        leases = leases[:limit]
    runs = []
    for lease in leases:
        run = lease.run
        run.lease = lease
        runs.append(run)
    return runs


def lock_run(*, tenant: Tenant, run_id: object) -> Run:
    """One run of ``tenant`` with its lease, both rows locked."""
    runs = locked_runs({"run__tenant": tenant, "run_id": parse_id(run_id, "run")})
    if not runs:
        raise NotFound("run not found")
    return runs[0]


def fence_reason(lease: RunLease, token: int, now: datetime, *, owner_id: str | None = None) -> str | None:
    """Why ``token`` (and ``owner_id``, when given) may not write now; None when it may."""
    if lease.owner_id is None and lease.fencing_token == token:
        return (lease.end_reason or "not_held").lower()  # ended (or never held), nobody holds it now
    if owner_id is not None and lease.owner_id != owner_id:
        return "owner_changed"
    if lease.fencing_token != token:
        return "token_changed"
    if lease.expires_at <= now:
        return "expired"
    return None


@dataclass
class Fenced:
    """What a fenced write gets: the locked run, its chain batch, the clock and the actor."""

    run: Run
    batch: ChainBatch
    now: datetime
    actor: str
    token: int

    @property
    def lease(self) -> RunLease:
        return self.run.lease


def fenced(
    *,
    worker: Worker,
    run_id: object,
    token: int,
    attempted: str,
    write: Callable[[Fenced], T],
    owner_id: str | None = None,
    on_refused: Callable[[Fenced, str], None] | None = None,
    refusal: Callable[[str], DomainError] = StaleToken,
) -> T:
    """Run ``write`` under the fence, or record and raise the refusal."""
    with transaction.atomic():
        run = lock_run(tenant=worker.tenant, run_id=run_id)
        now = timezone.now()
        reason = fence_reason(run.lease, token, now, owner_id=owner_id)
        # The presenter is the lease's owner only if the fence holds; otherwise all we
        # know is the worker identity and the token it presented.
        presenter = owner_id or (run.lease.owner_id if reason is None else f"token-{token}")
        ctx = Fenced(run=run, batch=ChainBatch(now), now=now, actor=worker_actor(worker, presenter), token=token)
        if reason is None:
            result = write(ctx)
            ctx.batch.commit()
            return result
        record_refusal(ctx, attempted=attempted, reason=reason)
        if on_refused is not None:
            on_refused(ctx, reason)
        ctx.batch.commit()
    raise refusal(reason)


def record_refusal(ctx: Fenced, *, attempted: str, reason: str) -> None:
    Run.objects.filter(pk=ctx.run.pk).update(stale_rejections=F("stale_rejections") + 1)
    ctx.run.stale_rejections += 1
    ctx.batch.append(
        ctx.run,
        "STALE_TOKEN_REJECTED",
        actor=ctx.actor,
        fields={
            "attempted": attempted,
            "presented_token": ctx.token,
            "current_token": ctx.lease.fencing_token,
            "reason": reason,
        },
    )


def fence_check(*, tenant: Tenant, run_id: object, fencing_token: int) -> bool:
    """Read-only: is ``fencing_token`` the run's current, unexpired token right now?"""
    try:
        run_uuid = parse_id(run_id, "run")
    except NotFound:
        return False
    lease = RunLease.objects.filter(run_id=run_uuid, run__tenant=tenant).first()
    return lease is not None and fence_reason(lease, fencing_token, timezone.now()) is None
