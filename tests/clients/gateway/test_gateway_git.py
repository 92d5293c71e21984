"""fenceline-mcp in front of mcp-server-git (issue 37, items 1-4 and 7): the host sees the
upstream's tools; a read and a write are operations of the session's run; a retried write is one
effect; a run taken over by another owner refuses the next write before it reaches git; an
upstream killed mid-call leaves the operation UNKNOWN with a case."""

import contextlib
import os
import signal
import time
from datetime import timedelta

import anyio
from django.utils import timezone
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from approvals.models import ReconciliationCase
from fenceline_client import client as fl
from ledger.models import Event, Operation, Run, RunLease
from tests.clients.gateway.conftest import commits, gateway_pids, git_server_pids, git_upstream
from tests.factories import make_worker


def run_of(external_id: str) -> Run:
    return Run.objects.get(external_id=external_id)


def text(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "text", None) is not None)


async def upstream_tools(repo) -> list:
    command = git_upstream(repo)
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as direct:
        await direct.initialize()
        return (await direct.list_tools()).tools


def test_the_host_sees_the_upstreams_tools_unchanged_and_the_session_is_one_run(gateway, repo):
    async def scenario():
        async with gateway.session("--external-id", "mcp-list", upstream=git_upstream(repo)) as mcp:
            return (await mcp.list_tools()).tools

    through = anyio.run(scenario)
    direct = anyio.run(upstream_tools, repo)
    assert [t.model_dump() for t in through] == [t.model_dump() for t in direct]
    run = run_of("mcp-list")
    (started,) = Event.objects.filter(run=run, type="x.mcp.session")
    assert set(started.fields) == {"session_id", "client_name", "client_version", "protocol_version", "upstreams"}
    assert started.fields["upstreams"] == ["mcp-server-git"] and started.fields["client_name"] == "mcp"
    assert RunLease.objects.get(run=run).owner_id is None  # released at close


def test_a_read_and_a_write_are_confirmed_operations_with_digests(gateway, repo):
    (repo / "notes.txt").write_text("one\n")

    async def scenario():
        async with gateway.session("--external-id", "mcp-rw", upstream=git_upstream(repo)) as mcp:
            status = await mcp.call_tool("git_status", {"repo_path": str(repo)})
            added = await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
            committed = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "notes"})
            return status, added, committed

    status, added, committed = anyio.run(scenario)
    assert not status.is_error and "notes.txt" in text(status)
    assert not added.is_error and not committed.is_error
    assert commits(repo) == 2
    ops = {op.tool: op for op in Operation.objects.filter(run=run_of("mcp-rw"))}
    assert set(ops) == {"git_status", "git_add", "git_commit"}
    for op in ops.values():
        assert op.phase == "CONFIRMED" and op.args_digest.startswith("sha256:")
        assert op.provider_request_id.startswith("sha256:") and op.provider == "mcp-server-git"
    # no contract for these tools: the class is the worst case of the upstream's hints
    assert ops["git_status"].effect_class == "IDEMPOTENT" and ops["git_commit"].effect_class == "NON_RETRYABLE"


def test_the_same_write_retried_after_the_gateway_restarts_is_one_effect(gateway, repo):
    (repo / "notes.txt").write_text("one\n")
    commit = {"repo_path": str(repo), "message": "notes"}

    async def attempt():
        async with gateway.session("--external-id", "mcp-retry", upstream=git_upstream(repo)) as mcp:
            await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
            return await mcp.call_tool("git_commit", commit)

    first = anyio.run(attempt)
    (repo / "notes.txt").write_text("two\n")  # something new to commit: a repeated commit would land
    again = anyio.run(attempt)
    assert not first.is_error
    assert not again.is_error and text(again).startswith("ALREADY_CONFIRMED:")
    assert commits(repo) == 2  # one commit
    assert Operation.objects.filter(run=run_of("mcp-retry"), tool="git_commit").count() == 1


def test_a_run_taken_over_by_another_owner_refuses_the_next_write_before_git(gateway, repo, live_server):
    (repo / "notes.txt").write_text("one\n")

    async def scenario():
        async with gateway.session("--external-id", "mcp-taken", upstream=git_upstream(repo)) as mcp:
            await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
            run = run_of("mcp-taken")
            RunLease.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
            other = fl.Client(live_server.url, make_worker("acme", "worker-2").token).lease(str(run.pk))
            await anyio.to_thread.run_sync(other.__enter__)
            refused = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "late"})
            await anyio.to_thread.run_sync(other.release)
            return refused

    refused = anyio.run(scenario)
    assert refused.is_error
    assert text(refused).split(":")[0] in ("STALE_TOKEN", "LEASE_LOST") and "\n" not in text(refused)
    assert commits(repo) == 1  # git never saw the commit
    assert not Operation.objects.filter(run=run_of("mcp-taken"), tool="git_commit", phase="DISPATCHED").exists()


def test_an_upstream_killed_mid_call_leaves_the_write_unknown_with_a_case(gateway, repo, tmp_path):
    started = tmp_path / "hook-started"
    hook = repo / ".git/hooks/pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {started}\nsleep 60\n")
    hook.chmod(0o755)
    (repo / "notes.txt").write_text("one\n")

    async def kill_upstream_when_hook_runs():
        while not started.exists():
            await anyio.sleep(0.05)
        for pid in git_server_pids(repo):
            os.kill(pid, signal.SIGKILL)

    async def scenario():
        async with gateway.session("--external-id", "mcp-killed", upstream=git_upstream(repo)) as mcp:
            await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
            async with anyio.create_task_group() as group:
                group.start_soon(kill_upstream_when_hook_runs)
                lost = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "lost"})
            after = await mcp.call_tool("git_status", {"repo_path": str(repo)})
            return lost, after

    lost, after = anyio.run(scenario)
    assert lost.is_error and text(lost).startswith("OUTCOME_UNKNOWN:")
    op = Operation.objects.get(run=run_of("mcp-killed"), tool="git_commit")
    assert op.phase == "UNKNOWN"
    assert ReconciliationCase.objects.filter(operation=op).exists()
    assert after.is_error and text(after).startswith("UPSTREAM_GONE:")  # refused before any intent
    assert not Operation.objects.filter(run=run_of("mcp-killed"), tool="git_status").exists()


def test_a_host_on_the_stateless_protocol_gets_one_run_for_the_process(gateway, repo):
    # 2026-07-28: no initialize, each request carries its own envelope; the gateway's process is the session
    async def scenario():
        async with gateway.session("--external-id", "mcp-modern", upstream=git_upstream(repo), modern=True) as mcp:
            names = [tool.name for tool in (await mcp.list_tools()).tools]
            first = await mcp.call_tool("git_status", {"repo_path": str(repo)})
            second = await mcp.call_tool("git_log", {"repo_path": str(repo)})
            return names, first, second

    names, first, second = anyio.run(scenario)
    assert "git_commit" in names and not first.is_error and not second.is_error
    run = run_of("mcp-modern")
    (started,) = Event.objects.filter(run=run, type="x.mcp.session")
    assert started.fields["protocol_version"] == "2026-07-28"
    assert [op.phase for op in Operation.objects.filter(run=run)] == ["CONFIRMED", "CONFIRMED"]
    assert RunLease.objects.get(run=run).owner_id is None


def test_an_upstream_that_times_out_leaves_the_write_unknown_and_stays_connected(gateway, repo, tmp_path):
    hook = repo / ".git/hooks/pre-commit"
    hook.write_text("#!/bin/sh\nsleep 20\n")  # longer than the gateway's call_timeout_s
    hook.chmod(0o755)
    (repo / "notes.txt").write_text("one\n")

    async def scenario():
        config = {"call_timeout_s": 1}
        async with gateway.session("--external-id", "mcp-slow", upstream=git_upstream(repo), config=config) as mcp:
            await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
            slow = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "slow"})
            again = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "slow"})
            return slow, again

    slow, again = anyio.run(scenario)
    assert slow.is_error and text(slow).startswith("OUTCOME_UNKNOWN:")
    op = Operation.objects.get(run=run_of("mcp-slow"), tool="git_commit")
    assert op.phase == "UNKNOWN" and ReconciliationCase.objects.filter(operation=op).exists()
    # the host's retry replays the UNKNOWN: never a silent second commit
    assert again.is_error and text(again).startswith("ALREADY_UNKNOWN:")


def test_the_same_write_sent_again_while_in_flight_waits_for_it_and_is_one_commit(gateway, repo, tmp_path):
    started, release = tmp_path / "hook-started", tmp_path / "hook-release"
    hook = repo / ".git/hooks/pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {started}\nwhile [ ! -e {release} ]; do sleep 0.05; done\n")
    hook.chmod(0o755)
    (repo / "notes.txt").write_text("one\n")
    commit = {"repo_path": str(repo), "message": "once"}

    async def scenario():
        async with gateway.session("--external-id", "mcp-twice", upstream=git_upstream(repo)) as mcp:
            await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
            answers = []

            async def send():
                answers.append(await mcp.call_tool("git_commit", commit))

            async with anyio.create_task_group() as group:
                group.start_soon(send)
                while not started.exists():  # the first is in git's hook: in flight
                    await anyio.sleep(0.05)
                group.start_soon(send)  # the host sends it again
                # nothing outside the gateway shows the repeat has arrived: a pipe write is
                # milliseconds, this margin is for a loaded machine (a late repeat fails the test)
                await anyio.sleep(2)
                release.touch()
            return answers

    first, second = anyio.run(scenario)
    assert not first.is_error and second.model_dump() == first.model_dump()
    assert commits(repo) == 2
    assert Operation.objects.filter(run=run_of("mcp-twice"), tool="git_commit").count() == 1


def test_a_gateway_stopped_with_sigterm_releases_its_runs_lease(gateway, repo):
    async def scenario():
        async with gateway.session("--external-id", "mcp-sigterm", upstream=git_upstream(repo)) as mcp:
            await mcp.call_tool("git_status", {"repo_path": str(repo)})
            (pid,) = gateway_pids("mcp-sigterm")
            run = run_of("mcp-sigterm")
            assert RunLease.objects.get(run=run).owner_id is not None
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while gateway_pids("mcp-sigterm") and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            return run

    run = anyio.run(scenario)
    assert not gateway_pids("mcp-sigterm")
    lease = RunLease.objects.get(run=run)
    assert (lease.owner_id, lease.end_reason) == (None, "RELEASED")


def test_a_write_whose_gateway_died_after_dispatch_is_unknown_on_retry_and_not_repeated(gateway, repo, tmp_path):
    """The gateway is killed while git runs the commit it dispatched; the host retries through a
    new gateway on the same run. Under the same worker identity the lease is refused
    (RECONCILE_FIRST: its last boot left an effect in doubt); under another, the takeover has
    made the dispatched commit UNKNOWN with a case, and the retry answers that without calling
    git again."""
    runs = tmp_path / "hook-runs"
    hook = repo / ".git/hooks/pre-commit"
    hook.write_text(f"#!/bin/sh\necho run >> {runs}\nsleep 60\n")
    hook.chmod(0o755)
    (repo / "notes.txt").write_text("one\n")
    commit = {"repo_path": str(repo), "message": "notes"}

    async def kill_gateway_when_git_commits():
        while not runs.exists():
            await anyio.sleep(0.05)
        for pid in [*gateway_pids("mcp-died"), *git_server_pids(repo)]:
            os.kill(pid, signal.SIGKILL)

    async def dies():
        with contextlib.suppress(Exception):  # the host's session breaks with its gateway
            async with gateway.session("--external-id", "mcp-died", upstream=git_upstream(repo)) as mcp:
                await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
                async with anyio.create_task_group() as group:
                    group.start_soon(kill_gateway_when_git_commits)
                    await mcp.call_tool("git_commit", commit)

    async def retry(env=None):
        async with gateway.session("--external-id", "mcp-died", upstream=git_upstream(repo), env=env) as mcp:
            return await mcp.call_tool("git_commit", commit)

    anyio.run(dies)
    op = Operation.objects.get(run=run_of("mcp-died"), tool="git_commit")
    assert op.phase == "DISPATCHED"  # the dead gateway reported nothing
    hook.write_text(f"#!/bin/sh\necho run >> {runs}\n")  # a repeated commit would now land at once
    RunLease.objects.filter(run=op.run).update(expires_at=timezone.now() - timedelta(seconds=1))
    # The same worker identity restarted: its boot left an effect in doubt, so it is refused a lease.
    same = anyio.run(retry)
    assert same.is_error and text(same).startswith("RECONCILE_FIRST:")
    # Another worker's gateway takes the run over: the commit is UNKNOWN, and not made again.
    other = make_worker("acme", "worker-2")
    retried = anyio.run(retry, {"FENCELINE_TOKEN": other.token})
    assert retried.is_error and text(retried).startswith("ALREADY_UNKNOWN:")
    assert runs.read_text().count("run") == 1 and commits(repo) == 1  # git ran the hook once, committed nothing
    op.refresh_from_db()
    assert op.phase == "UNKNOWN" and ReconciliationCase.objects.filter(operation=op).exists()
