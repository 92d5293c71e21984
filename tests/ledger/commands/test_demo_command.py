"""The README's first command seeds through the real services on the embedded default."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_demo_seeds_on_the_embedded_postgresql_and_prints_a_working_token(state_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["FENCELINE_STATE_DIR"] = str(state_dir)
    done = manage(env, "demo", "--no-serve")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (state_dir / "postgres" / "PG_VERSION").exists()
    assert not (state_dir / "postgres" / "postmaster.pid").exists()  # stopped with the command
    lines = done.stdout.splitlines()
    token = lines[lines.index(next(line for line in lines if "bearer token" in line)) + 1].strip()
    assert token.startswith("flw_")
    # One lost answer found at the sandbox provider by the reconciler, one it cannot tell about.
    assert "provider lookups: 1 settled by reconciler:sandbox-payments, 1 handed to people" in done.stdout
    # The webhook to the sandbox's sink: the three pending approvals (a charge, the MCP session's
    # git push, the OpenAI Agents run's refund), the quarantine, the cleanup alert and the BROKEN
    # chain, each delivered signed.
    assert "webhooks: 6 notification(s) for ops-channel, 6 delivered to the sandbox sink (6 signed)" in done.stdout
    # An MCP session through the gateway: reads and a commit confirmed, a commit whose upstream
    # dropped (UNKNOWN, with its case), a push waiting for a person.
    assert (
        "MCP gateway session mcp:claude-desktop:a41c9e7d2b: 5 tool calls (3 CONFIRMED, 1 PENDING_APPROVAL, 1 UNKNOWN)"
        in done.stdout
    )
    # The framework adapters' runs: a refund waiting for a person (the SDK's interruption), a
    # graph's progress checkpoints in the adapter's shape.
    assert (
        "OpenAI Agents SDK run openai-agents:support-desk: 3 tool calls (CONFIRMED, CONFIRMED, PENDING_APPROVAL)"
        in done.stdout
    )
    assert (
        "LangGraph run langgraph:billing-triage: 2 tool calls (CONFIRMED, CONFIRMED), 5 progress checkpoints, "
        "completed" in done.stdout
    )
    # The upgrade window: an old build's rewrite of a provider id is a state conflict for a person.
    assert "upgrade window: operation.provider_ref in EXPAND" in done.stdout
    assert "found 1 conflict (see /upgrades/)" in done.stdout
    # A second start keeps the data and issues a fresh token.
    again = manage(env, "demo", "--no-serve")
    assert again.returncode == 0, again.stderr[-2000:]
    assert token not in again.stdout
    # The jobs run on the embedded default too: the leaky worker's lease ends, its two browser
    # sessions are closed, and the connection nobody can close fails again.
    for command, expected in (
        ("reap_leases", "reaped 1 expired leases"),
        ("reap_resources", "2 released"),
        ("reconcile_unknown", "UNKNOWN effect(s) looked up"),
    ):
        job = manage(env, command)
        assert job.returncode == 0, job.stderr[-2000:]
        assert expected in job.stdout, job.stdout
