"""One upstream MCP server as the gateway holds it: the SDK's ``ClientSession`` over
``stdio_client`` (a command) or ``streamable_http_client`` (a URL), kept open by one task for as
long as the gateway session lasts, restarted with a credential when a call needs one (the secret
goes into the environment of the command, or a header of the HTTP requests, and nowhere else).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from fenceline_client.gateway.config import Upstream

log = logging.getLogger("fenceline_client.gateway")
CLIENT_INFO = types.Implementation(name="fenceline-mcp", version="0.1.0")


class UpstreamGone(RuntimeError):
    """The upstream's connection is closed (its process exited, its server went away)."""


@dataclass(frozen=True)
class Held:
    """The credential lease an upstream was started with: its id, its scope and until when
    (monotonic) the gateway uses it."""

    lease_id: str
    action: str
    resource: str
    until: float


class Link:
    """A held connection to one upstream. ``start`` opens it (``secret`` for the credential's
    channel, ``held`` the lease it was lent under), ``stop`` closes it."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.session: ClientSession | None = None
        self.tools: list[types.Tool] = []
        self.resources = False
        self.prompts = False
        self.held: Held | None = None
        self._stop = anyio.Event()
        self._done = anyio.Event()

    @property
    def name(self) -> str:
        return self.upstream.name

    @asynccontextmanager
    async def _streams(self, secret: str | None) -> AsyncIterator[Any]:
        upstream, credential = self.upstream, self.upstream.credential
        if upstream.command:
            env = dict(upstream.env)
            if secret is not None and credential is not None and credential.env:
                env[credential.env] = secret
            params = StdioServerParameters(
                command=upstream.command[0], args=list(upstream.command[1:]), env=env or None, cwd=upstream.cwd
            )
            async with stdio_client(params) as streams:
                yield streams
            return
        headers = dict(upstream.headers)
        if secret is not None and credential is not None and credential.header:
            headers[credential.header] = credential.prefix + secret
        async with (
            create_mcp_http_client(headers=headers or None) as http,
            streamable_http_client(upstream.url, http_client=http) as streams,
        ):
            yield streams

    async def start(self, group: anyio.abc.TaskGroup, *, secret: str | None = None, held: Held | None = None) -> None:
        """Open the connection in a task of ``group`` and list its tools; raises what opening raised."""
        self._stop, self._done = anyio.Event(), anyio.Event()
        failure: list[BaseException] = []
        ready = anyio.Event()

        async def hold() -> None:
            try:
                async with AsyncExitStack() as stack:
                    read, write = await stack.enter_async_context(self._streams(secret))
                    session = await stack.enter_async_context(ClientSession(read, write, client_info=CLIENT_INFO))
                    initialized = await session.initialize()
                    capabilities = initialized.capabilities
                    self.resources, self.prompts = capabilities.resources is not None, capabilities.prompts is not None
                    self.tools = (await session.list_tools()).tools if capabilities.tools is not None else []
                    self.session, self.held = session, held
                    ready.set()
                    await self._stop.wait()
            except Exception as error:  # the upstream failed to start or went away: the session goes on
                failure.append(error)
                log.warning("upstream %s closed: %s", self.name, type(error).__name__)
            finally:
                self.session = None
                ready.set()
                self._done.set()

        group.start_soon(hold)
        await ready.wait()
        if self.session is None:
            raise UpstreamGone(f"upstream {self.name} did not start: {failure[0] if failure else 'closed'}")

    async def stop(self) -> None:
        self._stop.set()
        with anyio.move_on_after(10):
            await self._done.wait()

    def require(self) -> ClientSession:
        if self.session is None:
            raise UpstreamGone(f"upstream {self.name} is not connected")
        return self.session

    async def call(self, tool: str, arguments: dict[str, Any] | None, timeout_s: float) -> types.CallToolResult:
        result = await self.require().call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        if not isinstance(result, types.CallToolResult):
            raise UpstreamGone(f"upstream {self.name} answered {tool} with {type(result).__name__}")
        return result


async def close_all(links: list[Link]) -> None:
    for link in links:
        with contextlib.suppress(Exception):
            await link.stop()
