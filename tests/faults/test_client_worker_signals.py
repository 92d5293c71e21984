"""A real worker process built on the Python client (issue 13): sent SIGTERM mid-operation it
drains, reports the effect in flight, checkpoints, releases and exits 0, with nothing lost;
SIGKILLed mid-operation, its token is fenced and the effect becomes UNKNOWN with a case."""

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.models import Operation, RunLease, Worker, WorkerDrain
from ledger.services.fence.leases import leases_reap
from tests.helpers import assert_chain_intact

WORKER = Path(__file__).with_name("client_worker.py")


def start(run_id, live_server, acme, perform_s: str) -> subprocess.Popen:
    env = {**os.environ, "FENCELINE_URL": live_server.url, "FENCELINE_TOKEN": acme.token, "PERFORM_S": perform_s}
    return subprocess.Popen([sys.executable, str(WORKER), run_id], env=env, stdout=subprocess.PIPE, text=True)


def performing(proc, at_least: int) -> int:
    while True:
        line = proc.stdout.readline().split()
        assert line, "the worker exited early"
        if line[0] == "PERFORMING" and int(line[1]) >= at_least:
            return int(line[1])


def test_sigterm_mid_operation_drains_checkpoints_and_exits_zero_with_nothing_lost(api_for, acme, live_server):
    run_id = api_for(acme).create_run()
    proc = start(run_id, live_server, acme, perform_s="0.5")
    try:
        in_flight = performing(proc, at_least=3)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    ops = list(Operation.objects.filter(run_id=run_id).order_by("created_at"))
    assert len(ops) == in_flight and all(op.phase == "CONFIRMED" for op in ops)  # the one in flight finished
    lease = RunLease.objects.get(run_id=run_id)
    assert lease.owner_id is None and lease.end_reason == "RELEASED"
    assert Worker.objects.get(pk=acme.worker.pk).status == "STOPPED"
    drain = WorkerDrain.objects.get(worker=acme.worker)
    assert (drain.outcome, drain.unknown_count) == ("released", 0) and drain.stopped_at is not None
    assert not ReconciliationCase.objects.filter(run_id=run_id).exists()
    checkpoint = [e for e in assert_chain_intact(run_id) if e.type == "PROGRESS_CHECKPOINTED"][-1]
    assert (checkpoint.fields["position"], checkpoint.fields["instance_state"]) == (f"item-{in_flight}", "CHECKPOINTED")


def test_sigkill_mid_operation_is_fenced_and_leaves_unknown_with_a_case(api_for, acme, live_server):
    run_id = api_for(acme).create_run()
    proc = start(run_id, live_server, acme, perform_s="60")
    try:
        in_flight = performing(proc, at_least=1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert leases_reap().operations == 1
    op = Operation.objects.get(run_id=run_id, idempotency_key=f"submit:{run_id}:{in_flight}")
    assert op.phase == "UNKNOWN"
    assert ReconciliationCase.objects.get(operation=op).reason == "LEASE_LOST"
    late = api_for(acme).outcome(str(op.pk), 1, "CONFIRMED", provider_request_id="late")
    assert (late.status, late.body["error"]) == (409, "STALE_TOKEN")
