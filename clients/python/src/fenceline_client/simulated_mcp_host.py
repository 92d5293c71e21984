"""An agent host of the fleet simulator (``manage.py simulate``) that reaches its tools through
the MCP gateway: the MCP SDK's own client starts ``fenceline-mcp -- python -m
fenceline_client.sandbox_mcp`` over stdio, as Claude Desktop or Cursor would, and calls the
sandbox's tools (a write, a read, an append) session after session until SIGTERM; the
gateway's configuration names the upstream ``sandbox`` and makes each note a resource. Every call
is a fenced operation of the session's run; the gateway records the session on the run.

    FENCELINE_URL, FENCELINE_TOKEN   the server and this host's worker token
    python -m fenceline_client.simulated_mcp_host --name sim-mcp-host-1 [--calls 12] [--think 0.3]

It reports a boot first, reports each gateway process's clean end after its session (drain,
exit: ``ended``), prints one line per session (``SESSION <external id> <calls> <refused>``) and
exits 0 once SIGTERM has let the call in progress finish.
"""

from __future__ import annotations

import argparse
import hashlib
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

DOMAINS = ("runtime", "state", "credentials", "outbound_delivery", "admission")
stopping = False


def on_sigterm(signum: int, frame: object) -> None:
    global stopping
    stopping = True  # the session in progress finishes; the loop starts no other


def say(*words: object) -> None:
    print(*words, flush=True)


def worker_client() -> fl.Client:
    return fl.Client(os.environ["FENCELINE_URL"], os.environ["FENCELINE_TOKEN"], timeout=10)


def boot(name: str) -> None:
    client = worker_client()
    readiness = {domain: {"ok": True, "evidence": {}} for domain in DOMAINS}
    readiness["runtime"] = fl.runtime_readiness()
    config_hash = "sha256:" + hashlib.sha256(name.encode()).hexdigest()[:16]
    answer = client.boot(config_hash=config_hash, code_version="sim-mcp-1", readiness=readiness)
    say("BOOTED", answer["phase"], answer["worker_status"])


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


async def session(name: str, number: int, calls: int, config: Path, think_s: float) -> tuple[int, int]:
    """One MCP session through the gateway: (calls made, calls refused or failed)."""
    external_id = f"mcp:{name}:{os.getpid()}-{number}"
    refused = 0
    async with stdio_client(gateway(external_id, config)) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        for n in range(calls):
            if stopping:  # SIGTERM: the call in progress is done; the session closes, its lease released
                return n, refused
            key = f"{name}-{number % 3}"
            tool, arguments = (
                ("note_write", {"key": key, "value": f"v{number}"}),
                ("note_read", {"key": key}),
                ("note_append", {"key": key, "value": f"line {number}.{n}"}),
            )[n % 3]
            result = await mcp.call_tool(tool, arguments)
            refused += int(bool(result.is_error))
            await anyio.sleep(think_s)  # the model thinks between two tool calls
    return calls, refused


def ended(client: fl.Client) -> None:
    """The gateway process of the session is gone, cleanly: this host reports it for its worker
    identity (drain, then exit), as an orchestrator would. Each ``fenceline-mcp`` process
    reports its own boot before its first lease; one the server never saw exit counts as a crash,
    and the tenant's restart budget would quarantine the host after a few sessions."""
    client.drain(deadline_s=5, reason="the MCP session ended")
    client.exit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="this host's name (its runs' external ids)")
    parser.add_argument("--calls", type=int, default=12, help="tool calls per MCP session (default 12)")
    parser.add_argument("--think", type=float, default=0.3, help="seconds between two calls (default 0.3)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    boot(args.name)
    config = config_file()
    number = 0
    while not stopping:
        number += 1
        calls, refused = anyio.run(session, args.name, number, args.calls, config, args.think)
        say("SESSION", f"mcp:{args.name}:{os.getpid()}-{number}", calls, refused)
        ended(worker_client())
    say("EXITED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
