"""Liveness apart from ownership (issue 13, item 2; article "Your Agent Needs a Run Lease":
"Separate liveness from ownership"): a run and a worker show which of PROCESS_ALIVE,
LEASE_VALID, LEASE_LOST, OUTCOME_UNKNOWN and RECONCILIATION_REQUIRED hold, and the time
spent in OUTCOME_UNKNOWN."""

from datetime import timedelta

from django.utils import timezone

from approvals.selectors import worker_liveness
from ledger.models import RunLease, Worker
from ledger.services.fence.leases import leases_reap


def test_a_run_shows_liveness_and_ownership_apart_as_its_worker_goes_silent(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    assert client.acquire(run_id, "agent-a").status == 200
    assert client.post("/workers/me/heartbeat", {}).status == 200
    op = client.intend(run_id, 1, "pay:1", effect_class="NON_RETRYABLE").body["operation_id"]
    client.authorize(op, 1)
    client.dispatch(op, 1)
    assert client.get(f"/runs/{run_id}").body["liveness"]["states"] == ["PROCESS_ALIVE", "LEASE_VALID"]

    # The process still answers its heartbeat, but its lease ran out mid-call.
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    live = client.get(f"/runs/{run_id}").body["liveness"]
    # Alive and not the owner any more: the two are separate states, and the effect in flight
    # under the lost lease has no outcome anyone can report.
    assert live["states"] == ["PROCESS_ALIVE", "LEASE_LOST", "OUTCOME_UNKNOWN"], live

    leases_reap()  # the effect is UNKNOWN now, with a case for a person
    Worker.objects.filter(pk=acme.worker.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    live = client.get(f"/runs/{run_id}").body["liveness"]
    assert live["states"] == ["LEASE_LOST", "OUTCOME_UNKNOWN", "RECONCILIATION_REQUIRED"], live
    assert live["open_cases"] == 1 and live["unknown_since"] is not None
    assert live["seconds_in_unknown"] >= 0

    worker = worker_liveness(worker=Worker.objects.get(pk=acme.worker.pk))
    assert worker["states"] == ["LEASE_LOST", "OUTCOME_UNKNOWN", "RECONCILIATION_REQUIRED"], worker
    assert (worker["leases_valid"], worker["leases_lost"], worker["open_cases"]) == (0, 1, 1)
