"""The Run Lease article's failure-injection test, over HTTP, and its three repetitions:
a delayed provider response, a worker process killed right after dispatch, and a
duplicate request. The expectation is never "the old worker stopped" but "the old
worker could not mutate state after fencing"."""

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.models import Event, LeaseGrant, Operation, Run, RunLease
from ledger.services.fence.leases import leases_reap

WORKER_SCRIPT = Path(__file__).with_name("dispatching_worker.py")


def wait_for_expiry(api, run_id: str, token: int) -> None:
    """Let the lease run out — on the test's clock (its expiry moves into the past), so a
    loaded CI machine cannot make a slow step outlive a real one-second lease — and check
    that the fence now refuses ``token``."""
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api.post("/fence/check", {"run_id": run_id, "fencing_token": token}).body == {"valid": False}


def event_types(run_id: str) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True))


def test_stale_worker_is_fenced_after_takeover(api_for, acme):
    a = api_for(acme)
    b = api_for(acme)
    run_id = a.create_run()

    # 1. Worker A takes the lease: token 1.
    lease_a = a.acquire(run_id, "worker-a", ttl_s=30)
    assert lease_a.status == 200 and lease_a.body["fencing_token"] == 1

    # 2. A records its intent, is authorized, and pauses immediately before the side effect.
    op = a.intend(run_id, 1, "deploy:repo-a:91c2", effect_class="IDEMPOTENT")
    assert op.status == 201
    op_id = op.body["operation_id"]
    assert a.authorize(op_id, 1).status == 200

    # 3. A's lease expires while it is paused.
    wait_for_expiry(a, run_id, 1)

    # 4. Worker B takes over: token 2.
    lease_b = b.acquire(run_id, "worker-b", ttl_s=30)
    assert lease_b.status == 200 and lease_b.body["fencing_token"] == 2

    # 5. B replays the same intent (same key and parameters: same operation) and performs it.
    replay = b.intend(run_id, 2, "deploy:repo-a:91c2", effect_class="IDEMPOTENT")
    assert replay.status == 200 and replay.body["operation_id"] == op_id
    assert b.dispatch(op_id, 2).body == {"phase": "DISPATCHED", "reservation_id": None, "levers": None}
    assert b.outcome(op_id, 2, "CONFIRMED", provider_request_id="deploy-7781").body == {"phase": "CONFIRMED"}

    # 6. A resumes and attempts the same side effect with token 1.
    resumed = a.dispatch(op_id, 1)

    # 7. The fence rejects token 1.
    assert resumed.status == 409
    assert resumed.body["error"] == "STALE_TOKEN"
    assert a.post("/fence/check", {"run_id": run_id, "fencing_token": 1}).body == {"valid": False}

    # 8. One current owner; the effect happened once, under token 2; the refusal is in the ledger.
    run = Run.objects.select_related("lease").get(pk=run_id)
    assert (run.lease.owner_id, run.lease.fencing_token) == ("worker-b", 2)
    assert LeaseGrant.objects.filter(run=run, ended_at__isnull=True).count() == 1
    assert list(LeaseGrant.objects.filter(run=run).values_list("fencing_token", "end_reason")) == [
        (1, "EXPIRED"),
        (2, None),
    ]
    operation = Operation.objects.get(pk=op_id)
    assert (operation.phase, operation.fencing_token, operation.dispatch_owner_id) == ("CONFIRMED", 2, "worker-b")
    assert run.stale_rejections == 1
    refusal = Event.objects.get(run=run, type="STALE_TOKEN_REJECTED")
    assert refusal.actor == "worker:worker-1/token-1"  # attributed to the presenter, not the owner
    assert refusal.fields == {
        "attempted": "operation.dispatch",
        "presented_token": 1,
        "current_token": 2,
        "reason": "token_changed",
    }
    assert event_types(run_id).count("OPERATION_DISPATCHED") == 1


def test_delayed_provider_response_cannot_confirm_after_takeover(api_for, acme):
    a = api_for(acme)
    b = api_for(acme)
    run_id = a.create_run()
    a.acquire(run_id, "worker-a", ttl_s=30)
    op_id = a.intend(run_id, 1, "email:welcome:42").body["operation_id"]
    a.authorize(op_id, 1)
    assert a.dispatch(op_id, 1).status == 200  # the request leaves the boundary...

    wait_for_expiry(a, run_id, 1)  # ...and the provider's response is delayed past the lease
    assert b.acquire(run_id, "worker-b").body["fencing_token"] == 2
    # The takeover made A's in-flight effect UNKNOWN and opened a case.
    assert Operation.objects.get(pk=op_id).phase == "UNKNOWN"
    case = ReconciliationCase.objects.get(operation_id=op_id)
    assert (case.status, case.reason) == ("OPEN", "LEASE_LOST")

    # The delayed response arrives; A reports it under its fenced token.
    late = a.outcome(op_id, 1, "CONFIRMED", provider_request_id="msg-0042")
    assert late.status == 409 and late.body["error"] == "STALE_TOKEN"

    # Never guessed into success: still UNKNOWN, the provider id kept as unverified evidence.
    assert Operation.objects.get(pk=op_id).phase == "UNKNOWN"
    case.refresh_from_db()
    assert [e["provider_request_id"] for e in case.unverified_evidence] == ["msg-0042"]
    assert case.unverified_evidence[0]["verified"] is False
    assert b.get(f"/operations/{op_id}/retry-decision").body["decision"] == "RECONCILE"
    assert b.dispatch(op_id, 2).body["error"] == "WRONG_PHASE"
    assert "UNVERIFIED_EVIDENCE_RECEIVED" in event_types(run_id)


def test_worker_killed_after_dispatch_leaves_unknown_with_case(api_for, acme, live_server):
    env = {**os.environ, "FENCELINE_URL": live_server.url, "FENCELINE_TOKEN": acme.token}
    a = api_for(acme)
    run_id = a.create_run()
    proc = subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), run_id],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["DISPATCHED"], line
        op_id = line[1]
        os.kill(proc.pid, signal.SIGKILL)  # killed between dispatch and outcome
    finally:
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    assert Operation.objects.get(pk=op_id).phase == "DISPATCHED"

    wait_for_expiry(a, run_id, 1)
    reaped = leases_reap()
    assert (reaped.leases, reaped.operations) == (1, 1)

    op = Operation.objects.get(pk=op_id)
    assert op.phase == "UNKNOWN"
    assert ReconciliationCase.objects.filter(operation=op, status="OPEN", reason="LEASE_LOST").count() == 1

    # The replacement cannot re-dispatch it nor report it confirmed: it must reconcile.
    b = api_for(acme)
    assert b.acquire(run_id, "worker-b").body["fencing_token"] == 2
    assert b.dispatch(op_id, 2).body["error"] == "WRONG_PHASE"
    assert b.outcome(op_id, 2, "CONFIRMED").body["error"] == "WRONG_PHASE"
    assert b.get(f"/operations/{op_id}/retry-decision").body["decision"] == "RECONCILE"
    op.refresh_from_db()
    assert (op.phase, op.fencing_token) == ("UNKNOWN", 1)
    assert event_types(run_id).count("OPERATION_DISPATCHED") == 1


def test_duplicate_requests_change_nothing_twice(api_for, acme):
    a = api_for(acme)
    run_id = a.create_run()
    a.acquire(run_id, "worker-a", ttl_s=30)

    first = a.intend(run_id, 1, "ticket:incident-9")
    again = a.intend(run_id, 1, "ticket:incident-9")
    assert (first.status, again.status) == (201, 200)
    op_id = first.body["operation_id"]
    assert again.body["operation_id"] == op_id

    a.authorize(op_id, 1)
    assert a.dispatch(op_id, 1).status == 200
    duplicate_dispatch = a.dispatch(op_id, 1)
    assert duplicate_dispatch.status == 409
    assert duplicate_dispatch.body["error"] == "WRONG_PHASE"
    assert duplicate_dispatch.body["phase"] == "DISPATCHED"

    assert a.outcome(op_id, 1, "CONFIRMED", provider_request_id="T-9").body == {"phase": "CONFIRMED"}
    assert a.outcome(op_id, 1, "CONFIRMED", provider_request_id="T-9").body == {"phase": "CONFIRMED"}

    # The retransmitted dispatch arrives after the lease moved on: fenced.
    wait_for_expiry(a, run_id, 1)
    api_for(acme).acquire(run_id, "worker-b")
    late_copy = a.dispatch(op_id, 1)
    assert late_copy.status == 409 and late_copy.body["error"] == "STALE_TOKEN"

    types = event_types(run_id)
    assert types.count("OPERATION_PLANNED") == 1
    assert types.count("OPERATION_DISPATCHED") == 1
    assert types.count("OPERATION_CONFIRMED") == 1
    assert Operation.objects.filter(tenant=acme.tenant).count() == 1
