"""The README's first command seeds through the real services on the embedded default."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

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
    # chain, and the UNKNOWN left unclaimed three hours (the case timers escalated it), each
    # delivered signed.
    assert "webhooks: 7 notification(s) for ops-channel, 7 delivered to the sandbox sink (7 signed)" in done.stdout
    # Runbooks for every case reason and for the verdicts that leave a case to people.
    assert "wrote 7 runbooks for tenant demo" in done.stdout
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


def _descendants(root: int) -> set[int]:
    """The processes below ``root`` now (from /proc: each process's parent)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_the_demo_is_quiet_and_a_sigterm_stops_it_whole(state_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["FENCELINE_STATE_DIR"] = str(state_dir)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        # The worker and its beat process (a child of the worker).
        while not any("bearer token" in line for line in lines) or (
            sum("celery" in _cmdline(pid) for pid in _descendants(demo.pid)) < 2
        ):
            assert demo.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.5)
        for path in ("/healthz", "/", "/accounts/login/", "/api/v1/openapi.json"):
            requests.get(f"http://127.0.0.1:{port}{path}", timeout=30)
        children = _descendants(demo.pid)
        jobs = {pid for pid in children if "celery" in _cmdline(pid)}
        assert jobs
        time.sleep(1)  # what the requests would have printed has been read by now
        said = "".join(lines)
        # The token and the URL come last: no request log line in the terminal after them.
        tail = said[said.index("bearer token") :]
        assert '"logger": "fenceline.request"' not in tail and " /healthz" not in tail, tail
        token_line, url_line = tail.rstrip().splitlines()[-2:]
        assert token_line.strip().startswith("flw_"), tail
        assert url_line.startswith(f"Fenceline demo at http://127.0.0.1:{port}/"), tail
        assert "/accounts/login/" in (state_dir / "demo-requests.log").read_text()
        # A worker that does not finish its warm shutdown in time (as if busy with a long task):
        # the demo stops it anyway, and its beat process with it.
        worker = next(pid for pid in jobs if _parent(pid) == demo.pid)
        os.kill(worker, signal.SIGSTOP)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(90) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
    reader.join(5)
    left = {pid: _cmdline(pid) for pid in children if _alive(pid)}
    deadline = time.monotonic() + 15
    while left and time.monotonic() < deadline:  # a child the demo stopped may take a moment to go
        time.sleep(0.5)
        left = {pid: _cmdline(pid) for pid in left if _alive(pid)}
    assert not left, left
    assert not (state_dir / "postgres" / "postmaster.pid").exists()
