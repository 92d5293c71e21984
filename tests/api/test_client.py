"""The Python worker client against the live server over HTTP (issue 13, item 5): the lease
context renews in its thread and stops on LEASE_LOST, a stale write from the client is
refused, the operation walk, checkpoints, resources, drain, and every API error code reaches
its own exception."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

import ledger.api  # noqa: F401 - every service module (and its errors) is imported
from fenceline_client import client as fl
from ledger.errors import Denied as ServerDenied
from ledger.errors import DomainError
from ledger.models import Operation, RunLease, RunResource
from tests.factories import make_worker


@pytest.fixture
def worker(live_server, acme):
    return fl.Client(live_server.url, acme.token)


def test_a_worker_walks_a_run_through_the_client(worker):
    run_id = worker.create_run(external_id="client-1")
    with worker.lease(run_id, ttl_s=3) as lease:
        assert lease.token == 1 and lease.checkpoint_state is None
        done = lease.operation(
            tool="email",
            action="send",
            resource="mailto:ops@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key="mail:1",
            perform=lambda: fl.Done(provider_request_id="msg-1"),
        )
        assert done["phase"] == "CONFIRMED"
        lease.checkpoint("sent", {"n": 1})
        session = lease.attach("browser_session", "sandbox", "client-sess-1")
        time.sleep(1.5)  # the background thread renews at ttl/3
        assert lease.renewals >= 1
        lease.release_resource(session)
        lease.complete()
    assert Operation.objects.get(idempotency_key="mail:1").provider_request_id == "msg-1"
    assert RunResource.objects.get(pk=session).state == "RELEASE_REQUESTED"


def test_a_perform_that_raises_reports_unknown_and_the_replacement_resumes(worker, live_server, acme):
    run_id = worker.create_run()

    def provider_call() -> fl.Done:
        raise TimeoutError("the provider did not answer")

    with worker.lease(run_id) as lease:
        lease.checkpoint("before-charge", {"step": 3})
        with pytest.raises(TimeoutError):
            lease.operation(
                tool="payments",
                action="charge",
                resource="customer:881",
                effect_class="NON_RETRYABLE",
                idempotency_key="charge:881",
                perform=provider_call,
            )
    assert Operation.objects.get(idempotency_key="charge:881").phase == "UNKNOWN"
    other = fl.Client(live_server.url, make_worker("acme", "worker-2").token)
    with other.lease(run_id) as lease:
        assert (lease.token, lease.checkpoint_position, lease.checkpoint_state) == (2, "before-charge", {"step": 3})


def test_the_renewal_thread_stops_on_lease_lost_and_the_next_call_raises_it(worker, live_server, acme):
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=2) as lease:
        RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
        taken = fl.Client(live_server.url, make_worker("acme", "worker-2").token).lease(run_id)
        taken.__enter__()
        deadline = time.monotonic() + 5
        while lease.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not lease.alive
        with pytest.raises((fl.LeaseLost, fl.StaleToken)):
            lease.event("NOTE", {"late": True})
        taken.__exit__(None, None, None)
    # The stale write never landed.
    assert not Operation.objects.filter(run_id=run_id).exists()


def test_a_stale_write_from_the_client_is_refused(worker, live_server):
    run_id = worker.create_run()
    lease = worker.lease(run_id, ttl_s=30)
    lease.__enter__()
    lease._stop.set()  # a paused worker: no more renewals
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(fl.StaleToken) as refused:
        lease.post(
            f"/runs/{run_id}/operations",
            {"tool": "x", "action": "y", "resource": "z", "effect_class": "PURE", "idempotency_key": "k"},
        )
    assert refused.value.body["reason"] == "expired"


def test_cancel_and_drain_reach_the_worker_as_exceptions(worker, live_server, acme):
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=3) as lease:
        lease.cancel_run("not needed any more")
        with pytest.raises(fl.RunCancelled):
            lease.event("NOTE", {"after": "cancel"})
    run_id = worker.create_run()
    with worker.lease(run_id) as lease:
        worker.drain(deadline_s=60, reason="SIGTERM")
        with pytest.raises(fl.WorkerDraining):
            lease.operation(
                tool="t", action="a", resource="r", effect_class="PURE", idempotency_key="k2", perform=fl.Done
            )
        lease.checkpoint("draining", {"ok": True})  # still accepted


def _codes() -> set[str]:
    found, stack = set(), [DomainError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls not in (DomainError, ServerDenied) and cls.code not in ("ERROR", "APPROVAL_REQUIRED"):
            found.add(cls.code)
    return found


def test_every_error_code_of_the_server_has_its_own_exception_in_the_client():
    missing = _codes() - set(fl.ERRORS)
    assert not missing, f"codes without a client exception: {sorted(missing)}"
    assert type(fl.error_for(403, {"error": "DENY_QUOTA", "quota": "q"})) is fl.Denied
    assert type(fl.error_for(401, {"error": "UNAUTHORIZED"})) is fl.Unauthorized
    assert type(fl.error_for(502, {"error": ""})) is fl.ServerError


def test_every_error_code_reaches_its_exception_over_http(worker, live_server, outsider):
    with pytest.raises(fl.Unauthorized):
        fl.Client(live_server.url, "flw_not-a-token").create_run()
    with pytest.raises(fl.NotFound):
        worker.get("/runs/00000000-0000-0000-0000-000000000000")
    with pytest.raises(fl.InvalidRequest):
        worker.post("/runs", {"schema_version": 1, "extra": 1})
    run_id = worker.create_run()
    with worker.lease(run_id), pytest.raises(fl.LeaseHeld):
        worker.lease(run_id).__enter__()
