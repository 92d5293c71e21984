"""Instances: each ownership generation of a run (a LeaseGrant), from allocation under the
tenant's quotas to verified cleanup (article "Agent Lifespan Management", its state diagram
in ``ledger.states.INSTANCE_TRANSITIONS``).

Every transition is a conditional UPDATE from the states the table allows, under the run's
lock, and one event in the run's chain records it:

* allocation (``instances_admit``) checks the quotas in the same transaction as the lease
  it grants; the instance is RUNNING once LEASE_ACQUIRED is written;
* a renewal moves RUNNING -> IDLE when nothing progressed since the previous one and
  nothing is in flight, and IDLE -> RUNNING once something did (``instance_renewed``);
* a drain moves it to DRAINING, the next checkpoint to CHECKPOINTED;
* a lost lease makes it EXPIRED; a lease given up makes it RELEASED, or REAPING while some
  of its resources are still open (``instances_plan`` / ``instances_end``); the resource
  reaper takes EXPIRED on to REAPING and REAPING to RELEASED once its driver confirmed the
  last resource closed (``reaper.instances_settle``).

A transition that happens with another event records itself in that event's fields
(``instance_state`` on LEASE_ACQUIRED, LEASE_RENEWED, LEASE_EXPIRED / RELEASED / REVOKED /
CANCELLED, WORKER_DRAINING, PROGRESS_CHECKPOINTED, RUN_COMPLETED / CANCELLED / TIMED_OUT);
the reaper's own transitions append INSTANCE_REAPING and INSTANCE_RELEASED (an EXPIRED
instance that never held a resource goes on to RELEASED in one INSTANCE_RELEASED that names
both states: cleanup had nothing to verify). Each transition is recorded exactly once.

The quotas count live instances (``INSTANCE_LIVE``). Two allocations racing for the last
slot are serialised by a transaction-scoped advisory lock per quota and subject, taken only
when the quota is set: a tenant without quotas takes no lock and runs no count.
"""

import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q

from ledger.errors import Denied
from ledger.models import LeaseGrant, Run, RunLease, RunResource, Worker
from ledger.policy import quotas_of
from ledger.services.evidence.append import ChainBatch
from ledger.services.lifespan.resources import resources_request_release
from ledger.sql import lifespan as sql_lifespan
from ledger.states import INSTANCE_LIVE, InstanceState, ResourceState, instance_sources


def instances_admit(*, run: Run, worker: Worker, tool: str, policy: dict[str, Any]) -> dict[str, int]:
    """Check the instance quotas for one more live instance of ``tool`` held by ``worker``:
    returns {quota: use before this one} for each set quota, or raises 403 DENY_QUOTA naming
    the quota, its limit and its current use. The caller holds the transaction that then
    creates the instance, so the count and the insert are one atomic step per quota."""
    quotas = quotas_of(policy)
    checks = [
        ("instances_per_tenant", quotas["instances_per_tenant"], Q(tenant_id=run.tenant_id)),
        ("instances_per_worker", quotas["instances_per_worker"], Q(worker_id=worker.pk)),
    ]
    if tool:
        tool_limit = quotas["instances_per_tool"].get(tool)
        checks.append((f"instances_per_tool.{tool}", tool_limit, Q(tenant_id=run.tenant_id, tool=tool)))
    use: dict[str, int] = {}
    for quota, limit, subject in checks:  # always in this order: no lock cycle
        if limit is None:
            continue
        sql_lifespan.advisory_lock(
            "instance-quota", quota, run.tenant_id, worker.pk if quota == "instances_per_worker" else ""
        )
        current = LeaseGrant.objects.filter(subject, state__in=INSTANCE_LIVE).count()
        if current >= limit:
            raise Denied(
                "DENY_QUOTA",
                f"quota {quota} is full: {current} of {limit} in use",
                quota=quota,
                limit=limit,
                use=current,
            )
        use[quota] = current
    return use


def instance_move(*, run: Run, target: InstanceState, batch: ChainBatch) -> bool:
    """The current instance of locked ``run`` to ``target`` along the table (at most one
    instance of a run is live, so the run names it). False when it was not in a source
    state. The caller records the transition in the event it appends for it."""
    moved = LeaseGrant.objects.filter(run_id=run.pk, state__in=instance_sources(target)).update(
        state=target, state_changed_at=batch.now
    )
    return bool(moved)


def instance_renewed(
    *, run: Run, lease: RunLease, previous_renewal: datetime, batch: ChainBatch
) -> InstanceState | None:
    """RUNNING -> IDLE when the run made no progress since ``previous_renewal`` and has
    nothing in flight; IDLE -> RUNNING once it did. Writes only on a change, and returns
    the new state for the renewal's event (None: unchanged)."""
    progressed = run.last_progress_at is not None and run.last_progress_at > previous_renewal
    idle = not progressed and run.n_dispatched == 0
    current = lease.instance_state or InstanceState.RUNNING
    target = InstanceState.IDLE if idle else InstanceState.RUNNING
    if current not in (InstanceState.RUNNING, InstanceState.IDLE) or target == current:
        return None
    if not instance_move(run=run, target=target, batch=batch):
        return None
    RunLease.objects.filter(run_id=run.pk).update(instance_state=target)
    lease.instance_state = target
    return target


def instances_drain(*, runs: list[Run], batch: ChainBatch) -> None:
    """The held instances of a draining worker: RUNNING / IDLE -> DRAINING (recorded by the
    WORKER_DRAINING event of each run)."""
    ids = [run.pk for run in runs]
    LeaseGrant.objects.filter(run_id__in=ids, state__in=instance_sources(InstanceState.DRAINING)).update(
        state=InstanceState.DRAINING, state_changed_at=batch.now
    )
    RunLease.objects.filter(run_id__in=ids, owner_id__isnull=False).update(instance_state=InstanceState.DRAINING)
    for run in runs:
        run.lease.instance_state = InstanceState.DRAINING


def instance_checkpointed(*, run: Run, batch: ChainBatch) -> InstanceState | None:
    """DRAINING -> CHECKPOINTED: the draining instance saved its progress (recorded by the
    PROGRESS_CHECKPOINTED event). Returns the new state, or None."""
    if run.lease.instance_state != InstanceState.DRAINING:
        return None
    if not instance_move(run=run, target=InstanceState.CHECKPOINTED, batch=batch):
        return None
    RunLease.objects.filter(run_id=run.pk).update(instance_state=InstanceState.CHECKPOINTED)
    run.lease.instance_state = InstanceState.CHECKPOINTED
    return InstanceState.CHECKPOINTED


def instances_plan(*, runs: list[Run], lost: bool) -> dict[uuid.UUID, InstanceState]:
    """Where the current instance of each locked run goes as its held lease ends now:
    EXPIRED when the lease was ``lost``; else RELEASED, or REAPING while a resource of the
    instance is still open. Runs whose lease is not held have no live instance: absent."""
    held = [run for run in runs if run.lease.owner_id is not None]
    if lost:
        return {run.pk: InstanceState.EXPIRED for run in held}
    fencing_tokens = {run.pk: run.lease.fencing_token for run in held}
    if not any(run.n_resources for run in held):  # nothing was ever attached: nothing open
        return dict.fromkeys(fencing_tokens, InstanceState.RELEASED)
    open_instances = set(
        RunResource.objects.filter(run_id__in=list(fencing_tokens))
        .exclude(state=ResourceState.RELEASED)
        .values_list("run_id", "instance__fencing_token")
        .distinct()
    )
    return {
        pk: InstanceState.REAPING if (pk, fencing_token) in open_instances else InstanceState.RELEASED
        for pk, fencing_token in fencing_tokens.items()
    }


def instances_end(
    *, runs: list[Run], plan: dict[uuid.UUID, InstanceState], batch: ChainBatch, actor: str, reason: str
) -> None:
    """Carry out ``plan`` (from :func:`instances_plan`, taken before the lease ended): hand
    every ACTIVE resource of the runs to the reaper (RELEASE_REQUESTED, one event per run
    that had any), then move each planned instance, one UPDATE per target state. The
    caller's lease-end or run-end event records the instance's new state."""
    if not runs:
        return
    resources_request_release(runs=runs, batch=batch, actor=actor, reason=reason)
    for target in set(plan.values()):
        ids = [pk for pk, planned in plan.items() if planned == target]
        LeaseGrant.objects.filter(run_id__in=ids, state__in=instance_sources(target)).update(
            state=target, state_changed_at=batch.now
        )
