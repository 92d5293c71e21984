"""An agent host of the fleet simulator (``manage.py simulate``) that reaches its tools through
the MCP gateway: the MCP SDK's own client starts ``fenceline-mcp`` over stdio in front of
``python -m fenceline_client.sandbox_mcp``, as Claude Desktop or Cursor would, and calls the
sandbox's tools (a write, a read, an append, the model thinking between two calls) until SIGTERM.
The gateway's configuration names the upstream ``sandbox`` and makes each note a resource. Like a
desktop host, it keeps its one gateway process (one MCP session, one run) for its whole life:
every call is a fenced operation of that run, and the gateway records the session on it.

    FENCELINE_URL, FENCELINE_TOKEN   the server and this host's worker token
    python -m fenceline_client.simulated_mcp_host --name sim-mcp-host-1 [--think 0.3]

The gateway reports the boot of its process before its first lease. At SIGTERM the call in
progress finishes, the session closes (the gateway releases its lease), and the host reports the
clean end for its worker identity (drain, exit), prints ``SESSION <external id> <calls>
<refused>`` and exits 0. (A gateway process that ends without an exit report counts as a crash:
the next one's boot would continue a restart episode.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from fenceline_client import client as fl

stopping = False


def on_sigterm(signum: int, frame: object) -> None:
    global stopping
    stopping = True  # the call in progress finishes, then the session closes


def say(*words: object) -> None:
    print(*words, flush=True)


def worker_client() -> fl.Client:
    return fl.Client(os.environ["FENCELINE_URL"], os.environ["FENCELINE_TOKEN"], timeout=10)


def config_file() -> Path:
    """The gateway's configuration: the sandbox upstream by name, each note its resource."""
    note = {"resource_from": "key", "resource_prefix": "note:"}
    config = {
        "upstreams": {"sandbox": {"command": [sys.executable, "-m", "fenceline_client.sandbox_mcp"]}},
        "tools": dict.fromkeys(("note_read", "note_write", "note_append"), note),
    }
    path = Path(tempfile.mkdtemp(prefix="fenceline-mcp-host-")) / "gateway.json"
    path.write_text(json.dumps(config))
    return path


def gateway(external_id: str, config: Path) -> StdioServerParameters:
    bin_dir = Path(sys.executable).parent
    env = {key: os.environ[key] for key in ("PATH", "HOME", "FENCELINE_URL", "FENCELINE_TOKEN") if key in os.environ}
    args = ["--config", str(config), "--external-id", external_id]
    return StdioServerParameters(command=str(bin_dir / "fenceline-mcp"), args=args, env=env)


async def session(external_id: str, config: Path, think_s: float) -> tuple[int, int]:
    """The host's MCP session through the gateway, until SIGTERM: (calls made, calls refused or failed)."""
    calls = refused = 0
    async with stdio_client(gateway(external_id, config)) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        while not stopping:
            key = f"note-{calls // 9 % 3}"
            tool, arguments = (
                ("note_write", {"key": key, "value": f"v{calls}"}),
                ("note_read", {"key": key}),
                ("note_append", {"key": key, "value": f"line {calls}"}),
            )[calls % 3]
            result = await mcp.call_tool(tool, arguments)
            calls += 1
            refused += int(bool(result.is_error))
            await anyio.sleep(think_s)  # the model thinks between two tool calls
    return calls, refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="this host's name (its run's external id)")
    parser.add_argument("--think", type=float, default=0.3, help="seconds between two calls (default 0.3)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    external_id = f"mcp:{args.name}:{os.getpid()}"
    calls, refused = anyio.run(session, external_id, config_file(), args.think)
    say("SESSION", external_id, calls, refused)
    client = worker_client()
    try:
        client.drain(deadline_s=5, reason="the agent host stopped")
        client.exit()
    except fl.FencelineError as refused_exit:  # the gateway's lease still live: it expires on its own
        say("EXIT_REFUSED", refused_exit.code)
    say("EXITED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
