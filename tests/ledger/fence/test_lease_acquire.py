import pytest

from approvals.models import ReconciliationCase
from ledger.errors import LeaseHeld, WorkerNotAccepting
from ledger.models import Event, LeaseGrant, Operation, Worker
from ledger.services.fence import leases
from ledger.states import WorkerStatus
from tests.factories import dispatched_operation, expire, leased_run, new_run
from tests.helpers import assert_chain_intact


def test_first_acquire_issues_token_one(acme):
    run = new_run(acme.worker)
    lease = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="a", ttl_s=30)
    assert (lease.owner_id, lease.fencing_token) == ("a", 1)
    assert list(Event.objects.filter(run=run).values_list("type", flat=True)) == ["RUN_CREATED", "LEASE_ACQUIRED"]


def test_a_held_lease_is_refused_even_to_its_own_owner(acme):
    run, _ = leased_run(acme.worker, owner="a")
    for owner in ("b", "a"):
        with pytest.raises(LeaseHeld):
            leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id=owner, ttl_s=30)
    assert LeaseGrant.objects.filter(run=run).count() == 1


def test_takeover_of_an_expired_lease_issues_previous_token_plus_one_and_orphans_dispatches(acme):
    run, token = leased_run(acme.worker, owner="a")
    op = dispatched_operation(acme.worker, run, token, "k-1")
    expire(run)

    lease = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="b", ttl_s=30)

    assert lease.fencing_token == token + 1
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"
    case = ReconciliationCase.objects.get(operation=op)
    assert (case.reason, case.status, case.attempt) == ("LEASE_LOST", "OPEN", 1)
    grants = list(
        LeaseGrant.objects.filter(run=run).values_list("fencing_token", "owner_id", "end_reason", "previous_owner_id")
    )
    assert grants == [(1, "a", "EXPIRED", None), (2, "b", None, "a")]
    types = [e.type for e in assert_chain_intact(run.pk)]
    assert types[-3:] == ["LEASE_EXPIRED", "OPERATION_UNKNOWN", "LEASE_ACQUIRED"]


def test_tokens_keep_growing_over_release_and_reacquire(acme):
    run, token = leased_run(acme.worker, owner="a")
    tokens, holder = [token], "a"
    for owner in ("b", "c", "a"):
        leases.lease_release(worker=acme.worker, run_id=run.pk, owner_id=holder, fencing_token=tokens[-1])
        tokens.append(leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id=owner, ttl_s=5).fencing_token)
        holder = owner
    assert tokens == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "status", [WorkerStatus.DRAINING, WorkerStatus.QUIESCED, WorkerStatus.STOPPED, WorkerStatus.QUARANTINED]
)
def test_a_worker_that_is_not_accepting_cannot_take_a_lease(acme, status):
    run = new_run(acme.worker)
    Worker.objects.filter(pk=acme.worker.pk).update(status=status)
    worker = Worker.objects.get(pk=acme.worker.pk)
    with pytest.raises(WorkerNotAccepting):
        leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="a", ttl_s=5)
    assert not LeaseGrant.objects.filter(run=run).exists()
