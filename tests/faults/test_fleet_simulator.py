"""The fleet simulator end to end (issue 13, item 6): real client worker processes, a real
API server and the sandbox provider, with every kind of chaos; the report is read from the
database and must add up."""

import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command

from approvals.models import ReconciliationCase
from console.simulation.fleet import RECONCILER
from ledger.models import Event, LeaseGrant, Operation, Run, Worker, WorkerBoot


@pytest.mark.slow
def test_a_short_simulation_leaves_real_history_that_adds_up(transactional_db, tmp_path):
    out = tmp_path / "report.json"
    call_command("simulate", seconds=20, workers=2, drop=0.3, seed=3, people_share=0.0, agent_hosts=0, json_path=out)
    report = json.loads(out.read_text())

    assert all(report["chaos"][kind] >= 1 for kind in ("paused", "killed", "terminated"))
    assert report["dispatched"] > 0 and report["confirmed"] > 0
    assert report["unknown_opened"] >= 1  # dropped answers at least
    assert report["chains_broken"] == 0 and report["chains_verified"] == report["runs"]
    assert report["effects_missing_from_ledger"] == 0  # every charge the provider made is in the ledger
    assert report["provider_charges"] <= report["dispatched"]  # a 503 or a kill before the call makes none

    # The crash-looping worker: quarantined by the restart budget, after a doubling delay.
    bad = Worker.objects.get(tenant__slug=report["tenant"], name="sim-bad-config")
    assert bad.status == "QUARANTINED" and bad.status_changed_by == "system:restart-budget"
    assert list(WorkerBoot.objects.filter(worker=bad).order_by("reported_at").values_list("delay_s", flat=True)) == [
        0,
        2,
        4,
        8,
    ]
    assert report["quarantines"] == 1  # the healthy ones were killed and drained, never quarantined

    # Every healthy worker drained on SIGTERM at the end and reached STOPPED.
    healthy = Worker.objects.filter(tenant__slug=report["tenant"], name__startswith="sim-worker-")
    assert set(healthy.values_list("status", flat=True)) == {"STOPPED"}
    assert report["drains"] >= 2 + 1 and report["drains_stopped"] == report["drains"]

    # Cases old enough were decided by looking the key up at the provider, with evidence.
    cases = ReconciliationCase.objects.filter(tenant__slug=report["tenant"])
    assert cases.count() == report["unknown_opened"]
    settled = cases.filter(resolved_by=f"reconciler:{RECONCILER}")
    assert settled.count() == report["reconciled_by_reconciler"] >= 1
    assert report["reconciled_by_people"] == 0 and report["handed_to_people"] == 0  # people_share 0
    for case in settled:
        assert case.lookup_history and case.lookup_history[-1]["verdict"] == case.resolution
        op = Operation.objects.get(pk=case.operation_id)
        assert op.phase == "RECONCILED" and op.reconciliation == case.resolution
        if case.resolution == "HAPPENED":
            assert op.provider_request_id.startswith("ch_")

    # A rolling deploy half done: sim-worker-2 runs the build before operation.provider_ref.
    # Both builds act side by side in EXPAND; every record stays at version 1 with both
    # representations written, agreeing, whichever build reported it.
    assert report["old_build_workers"] == 1
    workers = WorkerBoot.objects.filter(worker__name__startswith="sim-worker-")
    assert set(workers.values_list("code_version", flat=True)) == {"sim-1", "sim-2"}
    assert set(report["versions"]) == {"1"}
    reported = Operation.objects.exclude(provider_request_id="")
    assert report["with_provider_ref"] == reported.count() > 0
    for op in reported:
        assert op.provider_ref == {"provider": op.provider, "id": op.provider_request_id}

    # An agent host called its tools through fenceline-mcp: each MCP session is a run that the
    # gateway recorded, whose calls are operations with the args digest (what the run page shows).
    sessions = Run.objects.filter(tenant__slug=report["tenant"], external_id__startswith="mcp:sim-mcp-host-1:")
    assert report["mcp_sessions"] == sessions.count() >= 1
    assert report["mcp_calls"].get("CONFIRMED", 0) >= 1
    for run in sessions:
        [session] = Event.objects.filter(run=run, type="x.mcp.session")
        assert session.fields["upstreams"] == ["sandbox"]
        calls = Operation.objects.filter(run=run)
        assert set(calls.values_list("tool", flat=True)) <= {"note_write", "note_read", "note_append"}
        assert all(resource.startswith("note:") for resource in calls.values_list("resource", flat=True))
        assert all(digest.startswith("sha256:") for digest in calls.values_list("args_digest", flat=True))


@pytest.mark.slow
def test_the_simulators_terminal_shows_progress_lines_not_logs(transactional_db, capfd):
    call_command("simulate", seconds=15, workers=1, seed=5, every=5, mcp_hosts=0, agent_hosts=0)
    printed = capfd.readouterr()
    progress = [line for line in printed.out.splitlines() if line.startswith("[")]
    assert 2 <= len(progress) <= 4, printed.out  # one line per 5 s interval of 15 s
    assert '"logger"' not in printed.err and '"logger"' not in printed.out, printed.err[-2000:]
    assert "Traceback" not in printed.err, printed.err[-2000:]
    logs = next(line for line in printed.out.splitlines() if line.strip().startswith("logs "))
    server_log = Path(logs.split()[1]) / "server.log"
    assert "fenceline.request" in server_log.read_text()  # the request lines went there


def test_the_agent_hosts_run_the_framework_adapters_and_the_report_counts_them(transactional_db, tmp_path):
    """``--agent-hosts``: an OpenAI Agents SDK agent first, then a LangGraph graph, in turn,
    through the adapters (tests/clients/adapters/test_simulated_agent_host.py runs the host
    longer). Their tool calls are operations named by the adapters' idempotency key, the report
    counts them from the database, and every chain verifies."""
    out = tmp_path / "report.json"
    call_command("simulate", seconds=20, workers=1, mcp_hosts=0, agent_hosts=1, seed=5, json_path=out)
    report = json.loads(out.read_text())

    assert report["chains_broken"] == 0 and report["chains_verified"] == report["runs"]
    assert report["agent_runs"]["openai-agents"]["runs"] >= 1
    key = re.compile(r"^(?P<run>[0-9a-f-]{36}):(?P<tool>crm_\w+):[0-9a-f]{32}#\d+$")
    for framework, counted in report["agent_runs"].items():
        runs = Run.objects.filter(tenant__slug=report["tenant"], external_id__startswith=f"agent:{framework}:")
        calls = Operation.objects.filter(run__in=runs)
        assert counted["runs"] == runs.count() and counted["calls"] == calls.count() >= 1
        assert counted["completed"] == runs.filter(status="COMPLETED").count()
        # A host's first run of each framework asks a person for a refund (once per host process).
        assert counted["asked"] == calls.filter(phase="PENDING_APPROVAL", tool="crm_refund").count()
        for op in calls:
            match = key.match(op.idempotency_key)
            assert match and match["run"] == str(op.run_id) and match["tool"] == op.tool, op.idempotency_key
    # The agent runs are the host's own: no simulated worker was offered one.
    grants = LeaseGrant.objects.filter(run__tenant__slug=report["tenant"], run__external_id__startswith="agent:")
    assert set(grants.values_list("worker__name", flat=True)) == {"sim-agent-host-1"}
