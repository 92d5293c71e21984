"""The simulator's framework agent host (``fenceline_client.simulated_agent_host``, what
``manage.py simulate --agent-hosts`` starts) as a real process against the live server: an
OpenAI Agents SDK agent and a LangGraph graph in turn, through the adapters, with scripted
models. Every tool call is an operation under the adapters' idempotency key, outputs are kept
for replays, the graph saves LangGraph-shaped progress checkpoints, each framework's first run
waits for a person on its refund and the others complete; every chain verifies."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from approvals.models import ApprovalRequest
from console.simulation.fleet import AGENT_CONTRACTS
from fenceline_client.evidence_verifier import BROKEN
from ledger.models import Event, Operation, Run
from ledger.services.evidence.verification import run_verify
from tests.factories import set_policy

ROOT = Path(__file__).resolve().parents[3]
KEY = re.compile(r"^(?P<run>[0-9a-f-]{36}):(?P<tool>crm_\w+):[0-9a-f]{32}#(?P<ordinal>\d+)$")


def run_host(url: str, token: str, log: Path) -> tuple[str, dict[str, str]]:
    """The host until it has completed a run of each framework (or 120 s), then SIGTERM: its
    output and, just before the SIGTERM, the status of each approval by operation."""
    env = {**os.environ, "FENCELINE_URL": url, "FENCELINE_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "fenceline_client.simulated_agent_host", "--name", "host-1", "--think", "0"]
    with log.open("w") as output:
        host = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and host.poll() is None:
            text = log.read_text()
            if all(f"COMPLETED {framework}" in text for framework in ("openai-agents", "langgraph")):
                break
            time.sleep(0.5)
        before = {str(op): status for op, status in ApprovalRequest.objects.values_list("operation_id", "status")}
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=60) == 0, log.read_text()[-3000:]
    return log.read_text(), before


def test_the_agent_host_runs_both_adapters_and_leaves_a_refund_of_each_waiting(live_server, acme, tmp_path):
    set_policy(acme.tenant, tool_contracts=AGENT_CONTRACTS, human_approval_tools=["crm_refund"])
    output, before = run_host(live_server.url, acme.token, tmp_path / "host.log")
    assert "EXITED" in output and "EXIT_REFUSED" not in output

    for framework in ("openai-agents", "langgraph"):
        runs = Run.objects.filter(tenant=acme.tenant, external_id__startswith=f"agent:{framework}:host-1:")
        assert runs.count() >= 2
        calls = Operation.objects.filter(run__in=runs)
        for op in calls:
            match = KEY.match(op.idempotency_key)
            assert match and match["run"] == str(op.run_id) and match["tool"] == op.tool, op.idempotency_key
            assert op.args_digest.startswith("sha256:")
        confirmed = calls.filter(phase="CONFIRMED")
        assert set(confirmed.values_list("tool", flat=True)) == {"crm_lookup", "crm_note"}
        assert Event.objects.filter(run__in=runs, type="x.tool_result").count() == confirmed.count()
        [waiting] = calls.filter(phase="PENDING_APPROVAL")  # the first run's refund: nobody approves
        assert waiting.tool == "crm_refund" and waiting.run.status == "ACTIVE"
        # It waited for a person while the host held the run's lease; the host's end voided it.
        assert before[str(waiting.pk)] == "PENDING"
        assert ApprovalRequest.objects.get(operation=waiting).status == "VOID"
        assert runs.filter(status="COMPLETED").count() == runs.count() - 1
        assert f"PAUSED {framework} {waiting.run_id} {ApprovalRequest.objects.get(operation=waiting).pk}" in output

    for run in Run.objects.filter(tenant=acme.tenant, external_id__startswith="agent:langgraph:"):
        checkpoint = run.progress_checkpoints.order_by("-seq").first()
        assert set(checkpoint.state) == {"langgraph", "step", "next"}
        assert checkpoint.state["langgraph"]["thread_id"] == str(run.pk)
    for run in Run.objects.filter(tenant=acme.tenant):
        assert run_verify(run_id=run.pk).status != BROKEN
