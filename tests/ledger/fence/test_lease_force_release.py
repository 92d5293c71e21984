"""An admin's force-release of a run's lease (issue 40): what a takeover does to the old
owner — DISPATCHED operations UNKNOWN with a case each, approvals asked under its token
void, its instance ended — recorded as LEASE_REVOKED naming the admin and the reason; the
holder's token refused at its next write over the real fence (STALE_TOKEN); 403 for every
other role; a preview that went stale (the lease changed hands) does nothing; and the race
with the worker's renew and dispatch leaves nothing DISPATCHED without a holder."""

import pytest

from approvals.models import ReconciliationCase
from ledger.errors import Forbidden, LeaseLost, StaleToken, WrongPhase
from ledger.models import AdminAction, Event, Operation, RunLease
from ledger.services.fence import leases, operations
from ledger.services.fence.notes import event_append
from ledger.states import Phase
from tests.factories import dispatched_operation, expire, intended_operation, leased_run, new_run
from tests.helpers import assert_chain_intact, events_of, run_concurrently


def test_force_release_ends_the_lease_as_a_takeover_does_and_records_who_and_why(acme, admin):
    run, token = leased_run(acme.worker, owner="owner-a")
    op = dispatched_operation(acme.worker, run, token, "send-1")

    ended = leases.lease_force_release(user=admin, run_id=run.pk, fencing_token=token, reason="worker hung")

    assert (ended.owner_id, ended.fencing_token, ended.operations_unknown) == ("owner-a", token, 1)
    lease = RunLease.objects.get(run=run)
    assert lease.owner_id is None and lease.end_reason == "REVOKED" and lease.fencing_token == token
    assert Operation.objects.get(pk=op.pk).phase == Phase.UNKNOWN
    case = ReconciliationCase.objects.get(operation=op)
    assert case.status == "OPEN" and case.reason == "LEASE_REVOKED"
    (revoked,) = events_of(run, "LEASE_REVOKED")
    assert revoked.actor == "user:ada"
    assert revoked.fields["reason"] == "force-released: worker hung"
    assert revoked.fields["owner_id"] == "owner-a" and revoked.fields["fencing_token"] == token
    action = AdminAction.objects.get(action=leases.FORCE_RELEASE_ACTION)
    assert (action.actor, action.subject, action.reason) == ("user:ada", str(run.pk), "worker hung")
    assert_chain_intact(run.pk)


def test_the_released_holder_is_refused_at_its_next_write(acme, admin):
    run, token = leased_run(acme.worker)
    leases.lease_force_release(user=admin, run_id=run.pk, fencing_token=token, reason="stuck")
    with pytest.raises(StaleToken) as refused:
        event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"text": "late"})
    assert refused.value.detail.endswith("revoked")
    with pytest.raises(LeaseLost):
        leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)
    # Another worker takes the run over with a higher token.
    taken = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30)
    assert taken.fencing_token == token + 1
    assert_chain_intact(run.pk)


@pytest.mark.django_db(transaction=True)
def test_the_released_holder_is_refused_over_http(leased, acme, admin):
    """Over the real fence: the worker API answers the old holder 409 STALE_TOKEN."""
    client, run_id = leased
    leases.lease_force_release(user=admin, run_id=run_id, fencing_token=1, reason="stuck for an hour")
    answer = client.intend(run_id, 1, "after-release")
    assert answer.status == 409 and answer.body["error"] == "STALE_TOKEN"
    renew = client.post(f"/runs/{run_id}/lease/renew", {"owner_id": "worker-a", "fencing_token": 1, "ttl_s": 30})
    assert renew.status == 409 and renew.body["error"] == "LEASE_LOST"


@pytest.mark.parametrize("role", ["viewer", "operator", "approver", None])
def test_only_an_admin_may_force_release(acme, people, role):
    run, token = leased_run(acme.worker)
    with pytest.raises(Forbidden):
        leases.lease_force_release(user=people[role], run_id=run.pk, fencing_token=token, reason="no")
    assert RunLease.objects.get(run=run).owner_id == "owner-a"
    assert not events_of(run, "LEASE_REVOKED")


def test_another_tenants_admin_may_not_force_release(acme, outsider_admin):
    run, token = leased_run(acme.worker)
    with pytest.raises(Forbidden):
        leases.lease_force_release(user=outsider_admin, run_id=run.pk, fencing_token=token, reason="no")


def test_a_stale_preview_does_nothing_when_the_lease_changed_hands(acme, admin):
    run, token = leased_run(acme.worker, owner="owner-a")
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30)  # token + 1
    with pytest.raises(WrongPhase) as refused:
        leases.lease_force_release(user=admin, run_id=run.pk, fencing_token=token, reason="preview was old")
    assert f"token {token + 1}" in refused.value.detail
    assert RunLease.objects.get(run=run).owner_id == "owner-b"


def test_a_lease_nobody_holds_is_not_released(acme, admin):
    run = new_run(acme.worker)
    with pytest.raises(WrongPhase):
        leases.lease_force_release(user=admin, run_id=run.pk, fencing_token=0, reason="nothing")
    assert not events_of(run, "LEASE_REVOKED")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("step", ["dispatch", "renew"])
def test_force_release_racing_the_worker_leaves_nothing_dispatched_without_a_holder(acme, admin, step):
    """Force-release and the holder's dispatch (or renewal) at once, over and over: whichever
    commits first, no operation is left DISPATCHED once the lease is gone, and no write
    under the old token lands after LEASE_REVOKED (only its refusal is recorded)."""
    for attempt in range(6):
        run, token = leased_run(acme.worker)
        op = intended_operation(acme.worker, run, token, f"race-{step}-{attempt}", authorize=True)

        def act(i, run=run, token=token, op=op):
            if i == 0:
                return leases.lease_force_release(user=admin, run_id=run.pk, fencing_token=token, reason="race")
            if step == "dispatch":
                return operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
            return leases.lease_renew(
                worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=30
            )

        results = run_concurrently(act, 2)
        assert not isinstance(results[0], Exception), results
        assert results[1] is not None
        if isinstance(results[1], Exception):
            assert isinstance(results[1], (StaleToken, LeaseLost)), results
        assert RunLease.objects.get(run=run).owner_id is None
        assert Operation.objects.get(pk=op.pk).phase in (Phase.AUTHORIZED, Phase.UNKNOWN)
        assert not Operation.objects.filter(run=run, phase=Phase.DISPATCHED).exists()
        chain = list(Event.objects.filter(run=run).order_by("seq"))
        revoked_at = next(e.seq for e in chain if e.type == "LEASE_REVOKED")
        after = [e for e in chain if e.seq > revoked_at and e.actor.startswith("worker:")]
        assert all(e.type == "STALE_TOKEN_REJECTED" for e in after), [e.type for e in after]
        assert_chain_intact(run.pk)
