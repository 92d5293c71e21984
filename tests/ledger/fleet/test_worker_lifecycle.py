"""Worker lifecycle services: drain (no new lease; held ones may finish until the
deadline), quarantine (held leases end now: DISPATCHED effects become UNKNOWN, the old
token is stale), resume, and the drain-deadline job. Each change names its user and
reason in the worker row, an AdminAction and the chain of every run the worker held."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.errors import Forbidden, InvalidInput, NotFound, StaleToken, WorkerDraining, WorkerNotAccepting, WrongPhase
from ledger.models import AdminAction, Event, Operation, RunLease, Worker
from ledger.services.evidence.verification import ledger_verify
from ledger.services.fence import leases, outcomes
from ledger.services.fleet.lifecycle import worker_drain, worker_quarantine, worker_resume, workers_drain_enforce
from tests.factories import dispatched_operation, leased_run, make_worker, new_run
from tests.helpers import assert_chain_intact


def status(worker) -> str:
    return Worker.objects.get(pk=worker.pk).status


def test_a_draining_worker_takes_no_new_lease_but_finishes_what_it_holds(acme):
    run, token = leased_run(acme.worker, ttl_s=60)
    drained = worker_drain(worker_id=acme.worker.pk, reason="host patching", name="ann")
    assert drained.worker.status == "DRAINING" and drained.affected_run_ids == [run.pk]
    event = Event.objects.filter(run=run, type="WORKER_DRAINING").get()
    assert (event.actor, event.fields["reason"]) == ("user:ann", "host patching")
    worker = Worker.objects.get(pk=acme.worker.pk)
    with pytest.raises(WorkerNotAccepting):
        leases.lease_acquire(worker=worker, run_id=new_run(worker).pk, owner_id="o", ttl_s=30)
    with pytest.raises(WorkerDraining):  # nothing new on the held run either (issue 13)
        dispatched_operation(worker, run, token, "not-now")
    leases.lease_renew(worker=worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)


def test_quarantine_ends_held_leases_now_and_makes_dispatched_effects_unknown(acme):
    run, token = leased_run(acme.worker)
    op = dispatched_operation(acme.worker, run, token, "email-1")
    quarantined = worker_quarantine(worker_id=acme.worker.pk, reason="token seen in a paste", name="ann")
    assert quarantined.worker.status == "QUARANTINED"
    lease = RunLease.objects.get(run=run)
    assert (lease.owner_id, lease.end_reason) == (None, "REVOKED")
    assert Operation.objects.get(pk=op.pk).phase == "UNKNOWN"
    assert ReconciliationCase.objects.get(operation=op).reason == "LEASE_REVOKED"
    types = [e.type for e in assert_chain_intact(run.pk)]
    assert types[-3:] == ["WORKER_QUARANTINED", "LEASE_REVOKED", "OPERATION_UNKNOWN"]
    worker = Worker.objects.get(pk=acme.worker.pk)
    with pytest.raises(StaleToken):  # it wakes up believing it still owns the run
        outcomes.operation_report_outcome(
            worker=worker, operation_id=op.pk, fencing_token=token, outcome="CONFIRMED", provider_request_id="p-1"
        )
    with pytest.raises(WorkerNotAccepting):
        leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="o", ttl_s=30)
    record = AdminAction.objects.get(action="worker.quarantine")
    assert (record.actor, record.reason, record.fields["leases_revoked"]) == ("user:ann", "token seen in a paste", 1)
    # The verifier accepts the chain: the lease ended before anyone else wrote.
    result = ledger_verify(run_ids=[run.pk])
    assert result.broken == 0


def test_resume_lets_a_quarantined_worker_take_leases_again(acme):
    worker_quarantine(worker_id=acme.worker.pk, reason="check", name="ann")
    resumed = worker_resume(worker_id=acme.worker.pk, reason="host rebuilt", name="ann")
    assert resumed.worker.status == "ACCEPTING"
    _run, token = leased_run(Worker.objects.get(pk=acme.worker.pk))
    assert token == 1


@pytest.mark.parametrize(
    ("setup", "action", "wanted"),
    [
        (None, worker_resume, "DRAINING or QUIESCED or QUARANTINED"),
        ("quarantine", worker_quarantine, "ACCEPTING or DRAINING or QUIESCED"),
        ("drain", worker_drain, "ACCEPTING"),
    ],
)
def test_a_transition_from_the_wrong_status_is_refused_and_changes_nothing(acme, setup, action, wanted):
    if setup == "quarantine":
        worker_quarantine(worker_id=acme.worker.pk, reason="x", name="ann")
    elif setup == "drain":
        worker_drain(worker_id=acme.worker.pk, reason="x", name="ann")
    before = (status(acme.worker), AdminAction.objects.count(), Event.objects.count())
    with pytest.raises(WrongPhase) as refused:
        action(worker_id=acme.worker.pk, reason="again", name="ann")
    assert wanted in refused.value.detail
    assert (status(acme.worker), AdminAction.objects.count(), Event.objects.count()) == before


def test_a_decision_needs_a_reason_an_existing_worker_and_an_admin(acme, outsider, operator, admin):
    with pytest.raises(InvalidInput):
        worker_quarantine(worker_id=acme.worker.pk, reason="  ", name="ann")
    with pytest.raises(NotFound):
        worker_quarantine(worker_id=987654, reason="x", name="ann")
    with pytest.raises(Forbidden):
        worker_quarantine(worker_id=acme.worker.pk, reason="x", user=operator)
    with pytest.raises(Forbidden):  # an admin of acme is nobody on globex
        worker_quarantine(worker_id=outsider.worker.pk, reason="x", user=admin)
    assert status(acme.worker) == status(outsider.worker) == "ACCEPTING"


def test_the_drain_job_quiesces_idle_workers_and_revokes_leases_past_the_deadline(acme):
    idle = make_worker("acme", "idle").worker
    busy = make_worker("acme", "busy").worker
    late = make_worker("acme", "late").worker
    _, _ = leased_run(busy, ttl_s=600)
    late_run, late_token = leased_run(late, ttl_s=600)
    late_op = dispatched_operation(late, late_run, late_token, "late-1")
    for worker in (idle, busy, late):
        worker_drain(worker_id=worker.pk, reason="maintenance", deadline_s=300, name="ann")
    Worker.objects.filter(pk=late.pk).update(drain_deadline=timezone.now() - timedelta(seconds=1))  # the test's clock

    assert workers_drain_enforce() == 2
    assert (status(idle), status(busy), status(late)) == ("QUIESCED", "DRAINING", "QUIESCED")
    assert Operation.objects.get(pk=late_op.pk).phase == "UNKNOWN"
    assert Event.objects.filter(run=late_run, type="WORKER_QUIESCED", actor="system:drain").count() == 1
    assert workers_drain_enforce() == 0  # idempotent
    call_command("enforce_drains")
    assert status(busy) == "DRAINING"
