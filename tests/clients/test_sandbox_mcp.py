"""The simulator's and the gateway benchmark's MCP server (``fenceline_client.sandbox_mcp``),
driven over stdio by the MCP SDK's own client: its three tools with their hints, a write read
back, an append that is not idempotent."""

import sys
from concurrent.futures import ThreadPoolExecutor

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def test_the_sandbox_mcp_server_keeps_notes_and_says_which_tool_only_reads():
    async def scenario():
        params = StdioServerParameters(command=sys.executable, args=["-m", "fenceline_client.sandbox_mcp"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            tools = {tool.name: tool.annotations for tool in (await mcp.list_tools()).tools}
            texts = []
            for name, arguments in (
                ("note_read", {"key": "a"}),
                ("note_write", {"key": "a", "value": "one"}),
                ("note_append", {"key": "a", "value": "two"}),
                ("note_append", {"key": "a", "value": "two"}),
                ("note_read", {"key": "a"}),
            ):
                result = await mcp.call_tool(name, arguments)
                assert not result.is_error
                texts.append(result.content[0].text if result.content else "")
            return tools, texts

    # A thread of its own: a Playwright test earlier in this process leaves an event loop
    # running in the main thread, where anyio.run refuses to start another.
    with ThreadPoolExecutor(1) as pool:
        tools, texts = pool.submit(anyio.run, scenario).result(timeout=120)
    assert set(tools) == {"note_read", "note_write", "note_append"}
    assert tools["note_read"].read_only_hint is True
    assert tools["note_write"].read_only_hint is False and tools["note_write"].idempotent_hint is True
    assert tools["note_append"].idempotent_hint is False
    assert texts[0] == "" and texts[-1] == "one\ntwo\ntwo"
