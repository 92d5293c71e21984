"""Progress checkpoints over HTTP (issue 12, item 4): saved under the fence by the lease
owner, handed to the next owner with its lease, recorded in the chain by digest."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Event, ProgressCheckpoint, RunLease
from ledger.services.lifespan.checkpoints import MAX_STATE_BYTES, state_digest
from tests.factories import make_worker
from tests.helpers import assert_chain_intact, run_concurrently


@pytest.fixture
def leased(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    r = client.acquire(run_id, "worker-a")
    assert r.status == 200 and r.body["checkpoint"] is None, r  # nothing to resume yet
    return client, run_id


def save(client, run_id, token, position, state):
    return client.post(f"/runs/{run_id}/checkpoints", {"fencing_token": token, "position": position, "state": state})


def test_a_replacement_worker_resumes_from_the_latest_checkpoint(leased, api_for, db):
    client, run_id = leased
    assert save(client, run_id, 1, "page-1", {"done": [1]}).body["seq"] == 1
    second = save(client, run_id, 1, "page-2", {"done": [1, 2], "cursor": "c2"})
    assert second.status == 201, second
    assert second.body["digest"] == state_digest({"done": [1, 2], "cursor": "c2"})

    # The first worker vanishes; its lease runs out.
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    replacement = api_for(make_worker("acme", "worker-2"))
    r = replacement.acquire(run_id, "worker-b")
    assert r.status == 200, r
    assert r.body["fencing_token"] == 2
    resumed = r.body["checkpoint"]
    assert (resumed["seq"], resumed["position"], resumed["state"]) == (2, "page-2", {"done": [1, 2], "cursor": "c2"})
    assert resumed["checkpoint_id"] == second.body["checkpoint_id"]

    recorded = Event.objects.filter(run_id=run_id, type="PROGRESS_CHECKPOINTED").order_by("seq")
    assert [(e.fields["seq"], e.fields["position"]) for e in recorded] == [(1, "page-1"), (2, "page-2")]
    assert recorded.last().fields["digest"] == second.body["digest"]
    assert "cursor" not in str(recorded.last().fields)  # the chain holds the digest, not the state
    assert_chain_intact(run_id)


def test_a_stale_owner_cannot_overwrite_the_progress(leased, api_for, db):
    client, run_id = leased
    save(client, run_id, 1, "page-1", {"n": 1})
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api_for(make_worker("acme", "worker-2")).acquire(run_id, "worker-b").status == 200
    r = save(client, run_id, 1, "page-9", {"n": 9})  # the old owner wakes up
    assert (r.status, r.body["error"]) == (409, "STALE_TOKEN"), r
    assert list(ProgressCheckpoint.objects.values_list("position", flat=True)) == ["page-1"]


def test_state_passes_the_secret_boundary_and_its_size_limit(leased):
    client, run_id = leased
    r = save(client, run_id, 1, "p", {"session": {"cookie": "sid=CANARYcp1"}})
    assert (r.status, r.body["error"]) == (422, "FORBIDDEN_FIELD"), r
    assert "CANARYcp1" not in r.raw.text
    r = save(client, run_id, 1, "p", {"blob": "x" * MAX_STATE_BYTES})
    assert (r.status, r.body["fields"][0]["field"]) == (422, "state"), r
    r = save(client, run_id, 1, "p", {"n": 1e16})
    assert (r.status, r.body["fields"][0]["field"]) == (422, "state.n"), r
    assert not ProgressCheckpoint.objects.exists()
    assert not Event.objects.filter(type="PROGRESS_CHECKPOINTED").exists()


def test_concurrent_saves_by_the_owner_take_consecutive_seqs(leased):
    client, run_id = leased
    results = run_concurrently(lambda i: save(client, run_id, 1, f"step-{i}", {"i": i}), 8)
    assert all(r.status == 201 for r in results), results
    assert sorted(r.body["seq"] for r in results) == list(range(1, 9))
    assert ProgressCheckpoint.objects.filter(run_id=run_id).count() == 8
    assert_chain_intact(run_id)
