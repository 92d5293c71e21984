"""The two kill points issue 39 adds, each with a real process and SIGKILL:

* a worker killed right after the provider's response is stored (its outcome committed,
  before it goes on): the replacement worker repeats nothing and the chain verifies;
* a reconciler (the reconcile_unknown command) killed while the provider holds its lookup
  open: the case stays LOOKUP, no verdict is half-written, and the next pass settles it.
"""

import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.utils import timezone

from approvals.models import CaseStatus, ReconciliationCase
from approvals.services.lookups import cases_look_up
from ledger.models import Event, Operation, RunLease
from tests.factories import unknown_payment
from tests.helpers import assert_chain_intact, sandbox_charge, subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKER = Path(__file__).with_name("outcome_stored_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def start_worker(run_id, live_server, acme, provider_log, owner, **env) -> subprocess.Popen:
    environment = {
        **os.environ,
        "FENCELINE_URL": live_server.url,
        "FENCELINE_TOKEN": acme.token,
        "PROVIDER_LOG": str(provider_log),
        "OWNER_ID": owner,
        **env,
    }
    return subprocess.Popen([sys.executable, str(WORKER), run_id], env=environment, stdout=subprocess.PIPE, text=True)


def test_a_worker_killed_after_its_outcome_is_stored_repeats_nothing_on_restart(api_for, acme, live_server, tmp_path):
    run_id = api_for(acme).create_run()
    provider_log = tmp_path / "provider.log"
    first = start_worker(run_id, live_server, acme, provider_log, "owner-first", STOP_AFTER_OUTCOME="1")
    try:
        assert first.stdout.readline().split() == ["STORED", "CONFIRMED"]
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.wait(10)
    assert first.returncode == -signal.SIGKILL
    op = Operation.objects.get(run_id=run_id)
    assert (op.phase, op.attempt, op.provider_request_id) == ("CONFIRMED", 1, f"<{run_id}@mail.example>")

    # The lease the dead worker held runs out (the test's clock); a replacement takes the run over.
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    second = start_worker(run_id, live_server, acme, provider_log, "owner-second")
    try:
        assert second.stdout.readline().split() == ["DECIDED", "CONFIRMED"]
        assert second.wait(60) == 0
    finally:
        second.kill()

    assert provider_log.read_text().splitlines() == [f"sent {run_id}"]  # the provider was called once
    op.refresh_from_db()
    assert (op.phase, op.attempt) == ("CONFIRMED", 1)
    events = assert_chain_intact(run_id)
    assert [e.type for e in events].count("OPERATION_DISPATCHED") == 1
    assert [e.type for e in events].count("OPERATION_CONFIRMED") == 1
    assert events[-1].type == "RUN_COMPLETED"


class _HeldLookups(BaseHTTPRequestHandler):
    """A provider that takes every lookup and never answers until released."""

    asked: threading.Event
    released: threading.Event

    def do_GET(self) -> None:
        type(self).asked.set()
        type(self).released.wait(60)
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def holding_provider():
    handler = type("Held", (_HeldLookups,), {"asked": threading.Event(), "released": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    handler.released.set()
    server.shutdown()
    server.server_close()


def test_a_reconciler_killed_mid_lookup_leaves_the_case_open_and_the_next_pass_settles_it(
    acme, sandbox, holding_provider
):
    run, op, case = unknown_payment(acme.worker, "pay-killed-lookup")
    sandbox_charge(sandbox, "pay-killed-lookup")  # the charge did happen, at the real sandbox
    ReconciliationCase.objects.filter(pk=case.pk).update(next_lookup_at=timezone.now() - timedelta(seconds=1))
    server, held = holding_provider
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "FENCELINE_SANDBOX_PROVIDER_URL": f"http://127.0.0.1:{server.server_address[1]}",
    }
    env.pop("FENCELINE_RECONCILERS", None)
    reconciler = subprocess.Popen(
        [sys.executable, "manage.py", "reconcile_unknown"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert held.asked.wait(120), "the reconciler never asked the provider"
        os.kill(reconciler.pid, signal.SIGKILL)  # while the provider holds the lookup open
    finally:
        reconciler.wait(10)
    assert reconciler.returncode == -signal.SIGKILL

    case.refresh_from_db()
    op.refresh_from_db()
    assert (case.status, case.resolution, op.phase) == (CaseStatus.LOOKUP, "", "UNKNOWN")
    assert case.lookup_claimed_until is not None  # claimed by the dead pass until its claim runs out
    assert not Event.objects.filter(run=run, type__in=["CASE_LOOKED_UP", "CASE_RESOLVED"]).exists()
    assert_chain_intact(run.pk)

    # Another pass before the claim runs out leaves it alone; once it has run out, the case is
    # looked up again (at the sandbox, which answers) and settled.
    assert cases_look_up().claimed == 0
    ReconciliationCase.objects.filter(pk=case.pk).update(lookup_claimed_until=timezone.now() - timedelta(seconds=1))
    result = cases_look_up()
    assert (result.claimed, result.happened) == (1, 1)
    case.refresh_from_db()
    op.refresh_from_db()
    assert (case.status, op.phase, op.reconciliation) == (CaseStatus.RESOLVED, "RECONCILED", "HAPPENED")
    assert_chain_intact(run.pk)
