"""fenceline-mcp driven as a host drives it: the MCP SDK's own client (``ClientSession`` over
``stdio_client``) starts ``fenceline-mcp -- <upstream>`` as a process, against the live server,
with real upstreams nobody here wrote: ``mcp-server-git`` (PyPI) on a temporary repository and
``@modelcontextprotocol/server-filesystem`` (npm, installed here by .ci/bootstrap) on a
temporary folder."""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

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
        self, *args: str, upstream: list[str] | None = None, config: dict | None = None
    ) -> AsyncIterator[ClientSession]:
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
        }
        params = StdioServerParameters(command=str(BIN / "fenceline-mcp"), args=argv, env=env)
        with (self.tmp_path / "gateway.log").open("a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                yield session


@pytest.fixture
def gateway(live_server, acme, tmp_path) -> Gateway:
    return Gateway(live_server.url, acme.token, tmp_path)
