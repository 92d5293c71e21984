"""A worker drains itself over HTTP (issue 13, item 1): no new lease, intent or dispatch
while DRAINING (409 WORKER_DRAINING, each refused claim counted on the drain), what is in
flight may finish, the replacement picks the operation up under the same idempotency key,
QUIESCED -> STOPPED on exit or when the process heartbeat lapses, and the drain's five
signals are recorded."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Operation, Worker, WorkerDrain
from ledger.services.fleet.lifecycle import workers_drain_enforce, workers_stop_lapsed
from tests.factories import make_worker


@pytest.fixture
def draining(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    assert client.acquire(run_id, "agent-a").status == 200
    flying = client.intend(run_id, 1, "mail:1", effect_class="IDEMPOTENT").body["operation_id"]
    client.authorize(flying, 1)
    assert client.dispatch(flying, 1).status == 200
    waiting = client.intend(run_id, 1, "mail:2", effect_class="IDEMPOTENT").body["operation_id"]
    assert client.authorize(waiting, 1).status == 200
    r = client.post("/workers/me/drain", {"deadline_s": 120, "reason": "SIGTERM: deploying v2"})
    assert (r.status, r.body["status"]) == (200, "DRAINING"), r
    return client, run_id, flying, waiting


def test_a_draining_worker_finishes_what_is_in_flight_and_starts_nothing_new(draining, api_for, acme):
    client, run_id, flying, waiting = draining
    refused = [
        client.dispatch(waiting, 1),
        client.intend(run_id, 1, "mail:3"),
        client.acquire(api_for(make_worker("acme", "helper")).create_run(), "agent-a"),
    ]
    for r in refused:
        assert (r.status, r.body["error"]) == (409, "WORKER_DRAINING"), r
    assert Operation.objects.get(pk=waiting).phase == "AUTHORIZED"  # left for the replacement
    # What is in flight may finish: the outcome, a checkpoint, releasing a resource.
    assert client.outcome(flying, 1, "CONFIRMED", provider_request_id="m-1").status == 200
    saved = client.post(f"/runs/{run_id}/checkpoints", {"fencing_token": 1, "position": "m-2", "state": {"n": 1}})
    assert saved.status == 201, saved
    drain = WorkerDrain.objects.get(worker=acme.worker)
    assert (drain.started_by, drain.reason, drain.stale_claim_rejections) == (
        "worker:worker-1/-",
        "SIGTERM: deploying v2",
        3,
    )
    assert drain.deadline_at - drain.started_at == timedelta(seconds=120)

    assert client.post(f"/runs/{run_id}/lease/release", {"owner_id": "agent-a", "fencing_token": 1}).status == 200
    assert workers_drain_enforce() == 1
    drain.refresh_from_db()
    assert (drain.outcome, drain.unknown_count) == ("released", 0) and drain.quiesced_at is not None
    exited = client.post("/workers/me/exit", {})
    assert (exited.status, exited.body["status"]) == (200, "STOPPED"), exited
    drain.refresh_from_db()
    assert drain.stopped_at is not None

    # The replacement resumes from the checkpoint and dispatches the waiting operation under its key.
    replacement = api_for(make_worker("acme", "worker-2"))
    taken = replacement.acquire(run_id, "agent-b")
    assert (taken.body["fencing_token"], taken.body["checkpoint"]["position"]) == (2, "m-2")
    again = replacement.intend(run_id, 2, "mail:2", effect_class="IDEMPOTENT")
    assert (again.status, again.body["operation_id"]) == (200, waiting)
    assert replacement.dispatch(waiting, 2).status == 200
    assert Operation.objects.get(pk=waiting).fencing_token == 2


def test_past_its_deadline_the_drain_revokes_and_counts_what_it_left_unknown(draining, acme):
    client, _, flying, _ = draining
    Worker.objects.filter(pk=acme.worker.pk).update(drain_deadline=timezone.now() - timedelta(seconds=1))
    assert workers_drain_enforce() == 1
    drain = WorkerDrain.objects.get(worker=acme.worker)
    assert (drain.outcome, drain.unknown_count) == ("deadline", 1)
    assert Operation.objects.get(pk=flying).phase == "UNKNOWN"
    late = client.outcome(flying, 1, "CONFIRMED", provider_request_id="late")
    assert (late.status, late.body["error"]) == (409, "STALE_TOKEN"), late  # late writes are fenced


def test_a_quiesced_worker_whose_heartbeat_lapses_is_stopped(draining, acme):
    client, run_id, flying, _ = draining
    assert client.post("/workers/me/heartbeat", {}).body["status"] == "DRAINING"
    client.outcome(flying, 1, "FAILED", error_code="E")
    client.post(f"/runs/{run_id}/lease/release", {"owner_id": "agent-a", "fencing_token": 1})
    workers_drain_enforce()
    assert workers_stop_lapsed(lapse_s=60) == 0  # it beat a moment ago
    Worker.objects.filter(pk=acme.worker.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=61))
    assert workers_stop_lapsed(lapse_s=60) == 1
    assert Worker.objects.get(pk=acme.worker.pk).status == "STOPPED"


def test_an_exit_while_still_holding_a_lease_is_refused(draining):
    client, *_ = draining
    r = client.post("/workers/me/exit", {})
    assert (r.status, r.body["error"]) == (409, "WRONG_PHASE"), r
    assert r.body["detail"].startswith("worker is DRAINING with live leases"), r


def test_an_exit_before_a_drain_is_refused_naming_the_worker_phase(api_for, acme):
    r = api_for(acme).post("/workers/me/exit", {})
    assert (r.status, r.body["error"], r.body["phase"]) == (409, "WRONG_PHASE", "ACCEPTING"), r
    assert r.body["detail"] == "worker is ACCEPTING; this call needs QUIESCED", r


@pytest.mark.parametrize("body", [{}, {"deadline_s": 0}, {"deadline_s": 7 * 86400 + 1}, {"deadline_s": "60"}])
def test_a_drain_without_a_usable_deadline_is_refused_naming_it(api_for, acme, body):
    r = api_for(acme).post("/workers/me/drain", body)
    assert r.status == 422 and "deadline_s" in str(r.body["fields"]), r
    assert Worker.objects.get(pk=acme.worker.pk).status == "ACCEPTING"
