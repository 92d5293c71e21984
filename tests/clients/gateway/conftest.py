"""fenceline-mcp driven as a host drives it: the MCP SDK's own client (``ClientSession`` over
``stdio_client``) starts ``fenceline-mcp -- <upstream>`` as a process, against the live server,
with real upstreams nobody here wrote: ``mcp-server-git`` (PyPI) on a temporary repository and
``@modelcontextprotocol/server-filesystem`` (npm, installed here by .ci/bootstrap) on a
temporary folder."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.served import free_port

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
FILESYSTEM_SERVER = HERE / "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def commits(repo: Path) -> int:
    return int(git(repo, "rev-list", "--count", "HEAD").strip())


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository with one commit."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "agent@example.com")
    git(path, "config", "user.name", "agent")
    (path / "README.md").write_text("hello\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "first")
    return path


def processes(program: str, naming: str) -> list[int]:
    """The processes running ``program`` (as the interpreter's script or the executable itself,
    not as a later argument) with ``naming`` among their arguments."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(program.encode()) for part in cmdline[:2]) and naming.encode() in cmdline:
            found.append(int(proc.name))
    return found


def git_server_pids(repo: Path) -> list[int]:
    """The mcp-server-git processes serving ``repo`` (not the gateway, which names it later)."""
    return processes("mcp-server-git", str(repo))


def gateway_pids(external_id: str) -> list[int]:
    return processes("fenceline-mcp", external_id)


def git_upstream(repo: Path) -> list[str]:
    return [str(BIN / "mcp-server-git"), "--repository", str(repo)]


def filesystem_upstream(folder: Path) -> list[str]:
    node = shutil.which("node")
    assert node and FILESYSTEM_SERVER.exists(), "node and tests/clients/gateway/node_modules (.ci/bootstrap)"
    return [node, str(FILESYSTEM_SERVER), str(folder)]


class Gateway:
    """How a test starts the gateway: ``async with gateway.session(*args, upstream=[...]) as mcp``."""

    def __init__(self, url: str, token: str, tmp_path: Path) -> None:
        self.url, self.token, self.tmp_path = url, token, tmp_path

    @asynccontextmanager
    async def session(
        self,
        *args: str,
        upstream: list[str] | None = None,
        config: dict | None = None,
        env: dict | None = None,
        modern: bool = False,
    ) -> AsyncIterator[ClientSession]:
        """``modern``: the 2026-07-28 protocol (``server/discover``, no handshake, every request
        on its own) instead of the ``initialize`` handshake."""
        argv = list(args)
        if config is not None:
            path = self.tmp_path / f"gateway-{len(list(self.tmp_path.glob('gateway-*')))}.json"
            path.write_text(json.dumps(config))
            argv = ["--config", str(path), *argv]
        if upstream:
            argv = [*argv, "--", *upstream]
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.tmp_path),
            "FENCELINE_URL": self.url,
            "FENCELINE_TOKEN": self.token,
            **(env or {}),
        }
        params = StdioServerParameters(command=str(BIN / "fenceline-mcp"), args=argv, env=env)
        with (self.tmp_path / "gateway.log").open("a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await (session.discover() if modern else session.initialize())
                yield session


@pytest.fixture
def gateway(live_server, acme, tmp_path) -> Gateway:
    return Gateway(live_server.url, acme.token, tmp_path)


@pytest.fixture
def http_gateway(live_server, acme, tmp_path, repo):
    """fenceline-mcp serving streamable HTTP on a free port of loopback in front of mcp-server-git:
    yields its MCP endpoint's URL."""
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "FENCELINE_URL": live_server.url}
    (tmp_path / "token").write_text(acme.token + "\n")
    env["FENCELINE_TOKEN_FILE"] = str(tmp_path / "token")
    command = [str(BIN / "fenceline-mcp"), "--http", f"127.0.0.1:{port}", "--", *git_upstream(repo)]
    with (tmp_path / "gateway-http.log").open("w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)
