"""The Python worker client against the live server over HTTP (issue 13, item 5): the lease
context renews in its thread and stops on LEASE_LOST, a stale write from the client is
refused, the operation walk, checkpoints, resources, drain, and every API error code reaches
its own exception."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

import ledger.api  # noqa: F401 - every service module (and its errors) is imported
from approvals.services.approvals import approval_decide
from fenceline_client import client as fl
from ledger.errors import Denied as ServerDenied
from ledger.errors import DomainError
from ledger.models import Event, Operation, RunLease, RunResource
from ledger.services.upgrades.restore import effects_allow, effects_hold
from tests.factories import expire, make_worker, set_policy


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


# --- the effect walk: one call to start an effect (POST /runs/{run_id}/effects) -----------------


class Counting(fl.Client):
    """The client, remembering the (method, path) of every request it sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, str]] = []

    def call(self, method, path, body=None):
        self.sent.append((method, path))
        return super().call(method, path, body)


def _refused_perform() -> fl.Done:
    raise AssertionError("the provider was called for an effect decided before")


def test_an_effect_is_two_calls_and_its_replay_calls_no_provider(live_server, acme):
    worker = Counting(live_server.url, acme.token)
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=30) as lease:
        worker.sent.clear()
        done = lease.operation(
            tool="email",
            action="send",
            resource="mailto:ops@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key="mail:walk",
            perform=lambda: fl.Done(provider_request_id="msg-walk"),
        )
        walked = [path for method, path in worker.sent if not path.endswith("/lease/renew")]
        assert walked == [f"/runs/{run_id}/effects", f"/operations/{done['operation_id']}/outcome"]
        again = lease.operation(
            tool="email",
            action="send",
            resource="mailto:ops@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key="mail:walk",
            perform=_refused_perform,
        )
        assert again == {"operation_id": done["operation_id"], "phase": "CONFIRMED"}
    assert Event.objects.filter(run_id=run_id, type="OPERATION_DISPATCHED").count() == 1


def test_an_effect_waits_for_a_person_then_the_client_finishes_it(worker, acme):
    set_policy(acme.tenant, human_approval_tools=["payments"])
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=30) as lease:
        started = lease.effect_start(
            tool="payments",
            action="charge",
            resource="customer:881",
            idempotency_key="pay:walk",
            effect_class="NON_RETRYABLE",
        )
        assert started.phase == "PENDING_APPROVAL" and started.approval_id
        approval_decide(approval_id=started.approval_id, approve=True, decided_by="alice", reason="checked")
        dispatched = lease.effect_await_approval(started, timeout_s=30, poll_s=0.05)
        assert (dispatched.operation_id, dispatched.phase) == (started.operation_id, "DISPATCHED")
        assert lease.effect_outcome(started.operation_id, fl.Done(provider_request_id="ch-1")) == "CONFIRMED"
        denied = lease.effect_start(
            tool="payments",
            action="charge",
            resource="customer:882",
            idempotency_key="pay:no",
            effect_class="NON_RETRYABLE",
        )
        approval_decide(approval_id=denied.approval_id, approve=False, decided_by="alice", reason="not this one")
        with pytest.raises(fl.ApprovalDenied):
            lease.effect_await_approval(denied, timeout_s=30, poll_s=0.05)


def _start(lease, key, **overrides):
    intent = {"tool": "email", "action": "send", "resource": "mailto:ops@example.com", "effect_class": "IDEMPOTENT"}
    return lease.effect_start(idempotency_key=key, **{**intent, **overrides})


def test_every_refusal_of_the_effect_call_reaches_its_exception(worker, acme):
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=30) as lease:
        assert _start(lease, "k1").phase == "DISPATCHED"
        with pytest.raises(fl.IdempotencyMismatch):
            _start(lease, "k1", resource="mailto:other@example.com")
        set_policy(acme.tenant, tool_contracts=[{"tool": "search", "action": "*", "effect_class": "PURE"}])
        with pytest.raises(fl.EffectClassMismatch):
            _start(lease, "k2", tool="search", action="web", effect_class="NON_RETRYABLE")
        set_policy(acme.tenant, rules=[{"tool": "search", "actions": ["*"], "resources": ["*"]}])
        with pytest.raises(fl.Denied) as denied:
            _start(lease, "k3")
        assert denied.value.decision == "DENY_POLICY"
        assert _start(lease, "k3").phase == "DENIED"  # decided: the walk stops there
        set_policy(acme.tenant)
        effects_hold(by="ops", tenants=["acme"], reason="restored")
        with pytest.raises(fl.EffectsHeld):
            _start(lease, "k4")
        effects_allow(tenant="acme", reason="checked", name="ops")
        assert _start(lease, "k4").phase == "DISPATCHED"
        lease.cancel_run("not needed")
        with pytest.raises(fl.RunCancelled):
            _start(lease, "k5")
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=30) as lease:
        lease._stop.set()  # a paused worker: no more renewals
        expire(run_id)
        with pytest.raises(fl.StaleToken):
            _start(lease, "k6")
        assert not lease.alive
