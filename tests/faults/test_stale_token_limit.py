"""A worker that keeps writing with a dead token is told to stop (issue 13, item 4; the
run-lease article's "Recover: stop the worker"). Over HTTP against PostgreSQL: past the
policy's stale_token_limit within its window the worker is QUARANTINED once, even when the
rejections race; every response to it from then on carries the STOP_WORKER directive,
answers included; the client raises StopWorker at the next call; the bundle keeps the
count. Rejections spread wider than the window never add up to a quarantine."""

from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from fenceline_client import client as fl
from ledger.models import AdminAction, RunLease, Worker
from ledger.services.authority.policy import policy_change
from ledger.services.fleet.stale_tokens import worker_stale_rejected
from tests.helpers import run_concurrently

LIMIT = {"max_rejections": 5, "window_s": 60}


@pytest.fixture
def limited(acme):
    policy_change(tenant=acme.tenant, document={"stale_token_limit": LIMIT}, reason="tight", changed_by="admin@x")
    return acme


def dead_token_run(worker: fl.Client) -> str:
    """A run this worker lost: token 1 expired and a replacement holds token 2."""
    run_id = worker.create_run()
    worker.post(f"/runs/{run_id}/lease", {"owner_id": "old", "ttl_s": 30})
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    worker.post(f"/runs/{run_id}/lease", {"owner_id": "replacement", "ttl_s": 30})
    return run_id


def stale_write(worker: fl.Client, run_id: str):
    return worker.call("POST", f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {}})


def test_the_rejection_past_the_limit_quarantines_and_every_response_then_says_stop(live_server, limited):
    worker = fl.Client(live_server.url, limited.token)
    run_id = dead_token_run(worker)
    for _ in range(LIMIT["max_rejections"]):
        with pytest.raises(fl.StaleToken):
            stale_write(worker, run_id)
    assert Worker.objects.get(pk=limited.worker.pk).status == "ACCEPTING" and not worker.stop_requested
    with pytest.raises(fl.StaleToken):
        stale_write(worker, run_id)  # the sixth: quarantined, and this very answer says stop
    assert worker.stop_requested
    assert Worker.objects.get(pk=limited.worker.pk).status == "QUARANTINED"
    raw = requests.post(worker.base + "/workers/me/heartbeat", json={}, headers=worker.headers, timeout=5)
    assert raw.status_code == 200 and raw.headers["Fenceline-Directive"] == "STOP_WORKER"
    record = AdminAction.objects.get(tenant=limited.tenant, action="worker.quarantine")
    assert record.actor == "system:stale-tokens" and "6 stale-token rejections within 60 s" in record.reason
    assert record.fields["diagnostic_bundle"]["stale_rejections"]["count"] == 6


def test_the_client_raises_stop_worker_at_the_next_call_on_a_lease(live_server, limited):
    worker = fl.Client(live_server.url, limited.token)
    lost = dead_token_run(worker)
    fresh = worker.create_run()
    with worker.lease(fresh, ttl_s=30) as lease:
        for _ in range(LIMIT["max_rejections"] + 1):
            with pytest.raises(fl.StaleToken):
                stale_write(worker, lost)
        with pytest.raises(fl.StopWorker):
            lease.checkpoint("step-1", {"n": 1})
        assert not lease.alive


def test_racing_rejections_quarantine_the_worker_exactly_once(live_server, limited):
    run_id = dead_token_run(fl.Client(live_server.url, limited.token))

    def reject(_: int) -> str:
        worker = fl.Client(live_server.url, limited.token)
        try:
            stale_write(worker, run_id)
        except fl.StaleToken:
            return "stop" if worker.stop_requested else "refused"
        return "accepted"

    results = run_concurrently(reject, 16)
    assert set(results) <= {"stop", "refused"} and "stop" in results
    assert AdminAction.objects.filter(tenant=limited.tenant, action="worker.quarantine").count() == 1
    assert Worker.objects.get(pk=limited.worker.pk).stale_in_window == 16


def test_rejections_spread_wider_than_the_window_never_quarantine(limited):
    start = timezone.now()
    for n in range(3 * LIMIT["max_rejections"]):
        # one rejection every 15 s: at most 4 fall in any 60 s window
        assert worker_stale_rejected(worker=limited.worker, now=start + timedelta(seconds=15 * n)) is False
    assert Worker.objects.get(pk=limited.worker.pk).status == "ACCEPTING"
