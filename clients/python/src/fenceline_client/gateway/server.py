"""``fenceline-mcp``: the gateway as an MCP server (the SDK's low-level ``Server``), over stdio or
streamable HTTP, and its command line. ``tools/list`` and ``tools/call`` are the gateway's own
(``session.GatewaySession``); resources and prompts pass through to the upstreams unchanged
(prompts named like tools when there are several upstreams).

    fenceline-mcp [--config FILE] [--external-id ID | --run-id ID] [--http HOST:PORT] [-- COMMAND ARGS...]
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import uvicorn  # the SDK's own dependency: serves --http
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from fenceline_client.gateway.config import SEPARATOR, Config, ConfigError, build, read_file
from fenceline_client.gateway.session import GatewaySession
from fenceline_client.gateway.upstream import Link

log = logging.getLogger("fenceline_client.gateway")
SWEEP_S = 5.0

Context = ServerRequestContext["Gateway"]


class Gateway:
    """The gateway process: its configuration, the task group its upstream connections live in,
    and its ``GatewaySession``s, one per MCP session: over HTTP, one per ``Mcp-Session-Id``;
    over stdio, and for requests that carry no session (the 2026-07-28 protocol's stateless
    requests), the one session of the process."""

    def __init__(self, config: Config, group: anyio.abc.TaskGroup, server: Server[Any] | None = None) -> None:
        self.config, self.group, self.server = config, group, server
        self.sessions: dict[str, GatewaySession] = {}  # by MCP session id ("" for none)

    def session_for(self, ctx: Context) -> GatewaySession:
        connection = ctx.session._connection  # the SDK's connection: its session id, the client's info
        key = connection.session_id or ""
        found = self.sessions.get(key)
        if found is not None:
            return found
        session = self.sessions[key] = GatewaySession(self.config, self.group, session_id=key or None)
        client = connection.client_params.client_info if connection.client_params else None
        opening = partial(
            session.open,
            client_name=client.name if client else "",
            client_version=client.version if client else "",
            protocol_version=ctx.protocol_version,
        )
        self.group.start_soon(opening)
        return session

    def _live_http_ids(self) -> set[str] | None:
        # The SDK's manager keeps its sessions by id and has no public listing of them.
        manager = getattr(self.server, "_session_manager", None)
        instances = getattr(manager, "_server_instances", None)
        return set(instances) if isinstance(instances, dict) else None

    async def sweep(self) -> None:
        """Over HTTP: a session the SDK ended (the host's DELETE, its idle timeout) is closed
        here, its lease released."""
        while True:
            await anyio.sleep(SWEEP_S)
            live = self._live_http_ids()
            if live is None:
                continue
            for key, session in list(self.sessions.items()):
                if key and key not in live:
                    del self.sessions[key]
                    await session.close()

    async def close(self) -> None:
        sessions, self.sessions = list(self.sessions.values()), {}
        with anyio.CancelScope(shield=True):
            for session in sessions:
                await session.close()


# --- handlers ------------------------------------------------------------------------------


async def list_tools(ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    session = ctx.lifespan_context.session_for(ctx)
    await session.opened.wait()
    return types.ListToolsResult(tools=session.tools())


async def call_tool(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
    session = ctx.lifespan_context.session_for(ctx)
    return await session.call(params.name, params.arguments, ctx.session.report_progress)


async def initialized(ctx: Context, params: types.NotificationParams) -> None:
    ctx.lifespan_context.session_for(ctx)  # the run is created as the session starts


async def _links(ctx: Context, kind: str) -> list[Link]:
    session = ctx.lifespan_context.session_for(ctx)
    await session.opened.wait()
    return [link for link in session.links if link.session is not None and getattr(link, kind)]


async def list_resources(ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    found: list[types.Resource] = []
    for link in await _links(ctx, "resources"):
        found.extend((await link.require().list_resources()).resources)
    return types.ListResourcesResult(resources=found)


async def list_resource_templates(
    ctx: Context, params: types.PaginatedRequestParams | None
) -> types.ListResourceTemplatesResult:
    found: list[types.ResourceTemplate] = []
    for link in await _links(ctx, "resources"):
        found.extend((await link.require().list_resource_templates()).resource_templates)
    return types.ListResourceTemplatesResult(resource_templates=found)


async def read_resource(ctx: Context, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    links = await _links(ctx, "resources")
    for link in links[:-1]:  # the first upstream that reads it; the last one's answer stands
        try:
            return await link.require().read_resource(params.uri)
        except Exception:  # noqa: S112 - not this upstream's resource
            continue
    if not links:
        raise ValueError("no upstream serves resources")
    return await links[-1].require().read_resource(params.uri)


def _prompt_link(session: GatewaySession, name: str) -> tuple[Link, str]:
    if len(session.links) == 1:
        return session.links[0], name
    upstream, _, prompt = name.partition(SEPARATOR)
    for link in session.links:
        if link.name == upstream:
            return link, prompt
    raise ValueError(f"no upstream named {upstream!r}")


async def list_prompts(ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
    session = ctx.lifespan_context.session_for(ctx)
    found: list[types.Prompt] = []
    for link in await _links(ctx, "prompts"):
        prompts = (await link.require().list_prompts()).prompts
        if len(session.links) > 1:
            prompts = [p.model_copy(update={"name": f"{link.name}{SEPARATOR}{p.name}"}) for p in prompts]
        found.extend(prompts)
    return types.ListPromptsResult(prompts=found)


async def get_prompt(ctx: Context, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    session = ctx.lifespan_context.session_for(ctx)
    await session.opened.wait()
    link, name = _prompt_link(session, params.name)
    return await link.require().get_prompt(name, params.arguments)


def make_server(config: Config) -> Server[Gateway]:
    @asynccontextmanager
    async def lifespan(server: Server[Gateway]) -> AsyncIterator[Gateway]:
        async with anyio.create_task_group() as group:
            gateway = Gateway(config, group, server)
            group.start_soon(gateway.sweep)
            try:
                yield gateway
            finally:
                await gateway.close()
                group.cancel_scope.cancel()

    server: Server[Gateway] = Server(
        "fenceline-mcp",
        version="0.1.0",
        instructions="Every tool call is a fenced Fenceline operation; a refusal is one line: CODE: reason.",
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    server.add_notification_handler("notifications/initialized", types.NotificationParams, initialized)
    return server


# --- the command line ----------------------------------------------------------------------


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="fenceline-mcp",
        description="An MCP gateway: every tool call of the upstream MCP servers is a fenced Fenceline operation. "
        "Reads FENCELINE_URL and FENCELINE_TOKEN (or FENCELINE_TOKEN_FILE).",
        epilog="Simplest use: fenceline-mcp --external-id ID -- <upstream command and its arguments>",
    )
    parser.add_argument(
        "--config", help="a JSON or TOML file: upstreams, tool contracts, run binding (docs/gateway.md)"
    )
    binding = parser.add_mutually_exclusive_group()
    binding.add_argument("--external-id", help="the run's external id (created, or joined when it exists)")
    binding.add_argument("--run-id", help="join this existing run instead of creating one")
    parser.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp, not stdio")
    return parser.parse_args(argv), command


def main(argv: list[str] | None = None) -> int:
    args, command = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="fenceline-mcp: %(message)s")
    try:
        file = read_file(args.config) if args.config else None
        config = build(file=file, command=command, external_id=args.external_id, run_id=args.run_id)
    except (ConfigError, OSError) as failure:
        print(f"fenceline-mcp: {failure}", file=sys.stderr)
        return 2
    server = make_server(config)
    if args.http:
        host, _, port = args.http.rpartition(":")
        app = server.streamable_http_app(host=host or "127.0.0.1")
        uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning")
        return 0
    anyio.run(_serve_stdio, server)
    return 0


async def _serve_stdio(server: Server[Gateway]) -> None:
    """Until the host closes stdin, or SIGTERM / SIGINT: either way the lease is released."""
    async with anyio.create_task_group() as group:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    group.cancel_scope.cancel()
                    return

        group.start_soon(stop_on_signal)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
        group.cancel_scope.cancel()


if __name__ == "__main__":
    sys.exit(main())
