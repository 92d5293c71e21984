"""The end of an ownership: what every path that ends a lease (release, expiry, takeover,
revocation, a run's end) does, in one place.

The run's DISPATCHED operations become UNKNOWN with a reconciliation case each, in the same
transaction as the end (invariant 4); the approvals asked under the old token are void; the
instance leaves its live states and its run's ACTIVE resources go to the reaper.
"""

from typing import Any

from ledger.models import LeaseGrant, Run, RunLease
from ledger.services.core.handoff import queues
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.unknown import operations_mark_unknown, operations_orphaned
from ledger.services.lifespan.instances import instances_end, instances_plan
from ledger.sql import lifespan as sql_lifespan
from ledger.states import CaseReason, InstanceState, LeaseEnd

END_EVENTS = {
    LeaseEnd.EXPIRED: "LEASE_EXPIRED",
    LeaseEnd.RELEASED: "LEASE_RELEASED",
    LeaseEnd.REVOKED: "LEASE_REVOKED",
    LeaseEnd.CANCELLED: "LEASE_CANCELLED",
}
END_CASE_REASONS = {
    LeaseEnd.EXPIRED: CaseReason.LEASE_LOST,
    LeaseEnd.RELEASED: CaseReason.LEASE_RELEASED,
    LeaseEnd.REVOKED: CaseReason.LEASE_REVOKED,
    LeaseEnd.CANCELLED: CaseReason.RUN_CANCELLED,
}
LOST = frozenset({LeaseEnd.EXPIRED, LeaseEnd.REVOKED})  # the owner did not give it up


def leases_end(
    *, runs: list[Run], batch: ChainBatch, actor: str, end: LeaseEnd, reason: str = "", hand_back: bool = True
) -> int:
    """End the current ownership of ``runs`` (locked by the caller) with set-based updates:
    clear the owners, close their history rows, void the approvals asked under the old
    token, move their DISPATCHED operations to UNKNOWN with a case each, and (unless the
    caller does it later, as a run's end does after its revocations: ``hand_back=False``)
    end the instances and hand their resources to the reaper. Returns the number of
    operations moved."""
    run_ids = [run.pk for run in runs]
    lost = end in LOST
    plan = instances_plan(runs=runs, lost=lost) if hand_back else {}
    sql_lifespan.set_for_runs(
        RunLease,
        run_ids,
        {"owner_id": None, "worker": None, "expires_at": batch.now, "end_reason": end, "instance_state": ""},
    )
    grant_end: dict[str, Any] = {"ended_at": batch.now, "end_reason": end}
    # What instances_end still has to move: nothing when the statement that closes the grants
    # moves them too (each closed grant is its run's live instance, in a source state of
    # every end state): a lost lease's to EXPIRED, and a release's to RELEASED or REAPING
    # when every instance goes to the same one (one run, or none with an open resource).
    pending = plan
    if hand_back and lost:
        grant_end.update(state=InstanceState.EXPIRED, state_changed_at=batch.now)
        pending = {}
    elif hand_back and len(set(plan.values())) == 1:
        grant_end.update(state=next(iter(plan.values())), state_changed_at=batch.now)
        pending = {}
    sql_lifespan.set_for_runs(LeaseGrant, run_ids, grant_end, unset="ended_at")
    entries = []
    for run in runs:
        held = run.lease.owner_id is not None
        fields = {"owner_id": run.lease.owner_id, "fencing_token": run.lease.fencing_token}
        if reason:
            fields["reason"] = reason
        if hand_back and held:
            fields["instance_state"] = (plan.get(run.pk) or InstanceState.EXPIRED).value
        entries.append((run, fields))
        run.lease.owner_id, run.lease.worker, run.lease.expires_at, run.lease.end_reason = None, None, batch.now, end
        run.lease.instance_state = ""
    batch.append_many(entries, END_EVENTS[end], actor=actor)  # one event per run, built at once
    queues().approvals_void_for_runs(runs=runs, batch=batch, actor=actor)
    orphans = operations_orphaned(runs=runs)
    operations_mark_unknown(
        operations=orphans,
        runs={run.pk: run for run in runs},
        batch=batch,
        actor=actor,
        reason=END_CASE_REASONS[end],
    )
    if hand_back:
        instances_end(runs=runs, plan=pending, batch=batch, actor=actor, reason=reason or end.lower())
    return len(orphans)
