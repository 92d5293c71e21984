"""fenceline-mcp over streamable HTTP for a remote agent (issue 37, item 1): the SDK's
streamable-HTTP client, one MCP session = one run named after the MCP session id, the lease
released once the host ends the session."""

import time

import anyio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from ledger.models import Event, Operation, Run, RunLease


def test_a_remote_host_over_streamable_http_gets_a_run_per_mcp_session(http_gateway, repo):
    async def scenario():
        async with streamable_http_client(http_gateway) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            names = [tool.name for tool in (await mcp.list_tools()).tools]
            status = await mcp.call_tool("git_status", {"repo_path": str(repo)})
            return names, status

    names, status = anyio.run(scenario)
    assert "git_status" in names and not status.is_error
    (started,) = Event.objects.filter(type="x.mcp.session")
    run = Run.objects.get(pk=started.run_id)
    assert run.external_id == f"mcp:{started.fields['session_id']}" and len(started.fields["session_id"]) == 32
    assert Operation.objects.get(run=run).phase == "CONFIRMED"
    deadline = time.monotonic() + 60  # the gateway notices the ended session on its next sweep
    while RunLease.objects.get(run=run).owner_id is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert RunLease.objects.get(run=run).owner_id is None
