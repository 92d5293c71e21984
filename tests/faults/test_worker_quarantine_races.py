"""Quarantine against a worker that keeps acting, with real concurrency: threads with their
own HTTP connections to a threaded live server (their own PostgreSQL transactions) and a
quarantine in another thread. A quarantined worker must end up holding nothing: each
acquire either committed before the quarantine (and its lease was revoked by it) or saw
the worker no longer ACCEPTING."""

from ledger.models import Event, RunLease, Worker
from ledger.services.fleet.lifecycle import worker_quarantine
from tests.helpers import assert_chain_intact, run_concurrently

THREADS = 12


def test_acquires_racing_a_quarantine_leave_the_worker_holding_no_lease(api_for, acme):
    setup = api_for(acme)
    run_ids = [setup.create_run() for _ in range(THREADS - 1)]
    clients = [api_for(acme) for _ in range(THREADS - 1)]

    def act(i: int):
        if i == THREADS - 1:
            return worker_quarantine(worker_id=acme.worker.pk, reason="compromised host", name="ann")
        return clients[i].acquire(run_ids[i], f"agent-{i}", ttl_s=60)

    results = run_concurrently(act, THREADS)

    assert Worker.objects.get(pk=acme.worker.pk).status == "QUARANTINED"
    acquired = [r for r in results[:-1] if r.status == 200]
    refused = [r for r in results[:-1] if r.status != 200]
    assert {(r.status, r.body["error"]) for r in refused} <= {(409, "WORKER_NOT_ACCEPTING")}
    assert not RunLease.objects.filter(worker_id=acme.worker.pk, owner_id__isnull=False).exists()
    # Every lease that was granted was revoked by the quarantine, in its run's chain.
    revoked = set(Event.objects.filter(type="LEASE_REVOKED").values_list("run_id", flat=True))
    assert {str(r) for r in revoked} == {run_ids[i] for i, r in enumerate(results[:-1]) if r.status == 200}
    assert len(results[-1].affected_run_ids) == len(acquired)
    for run_id in run_ids:
        assert_chain_intact(run_id)


def test_a_quarantined_workers_writes_under_its_old_token_are_refused(api_for, acme):
    api = api_for(acme)
    run_id = api.create_run()
    token = api.acquire(run_id, "agent-a").body["fencing_token"]
    op_id = api.intend(run_id, token, "charge:1").body["operation_id"]
    api.authorize(op_id, token)

    worker_quarantine(worker_id=acme.worker.pk, reason="compromised host", name="ann")

    dispatch = api.dispatch(op_id, token)
    assert (dispatch.status, dispatch.body["error"]) == (409, "STALE_TOKEN")
    again = api.acquire(run_id, "agent-a")
    assert (again.status, again.body["error"]) == (409, "WORKER_NOT_ACCEPTING")
    types = [e.type for e in assert_chain_intact(run_id)]
    assert "OPERATION_DISPATCHED" not in types and types.count("STALE_TOKEN_REJECTED") == 1
