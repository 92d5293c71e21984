"""An upstream MCP server over streamable HTTP for the gateway's tests, built with the MCP SDK's
own ``MCPServer``: its one tool says whether the request carried ``Authorization: Bearer
<EXPECTED_SECRET>`` (the secret from its own environment), never the header's value; one
resource and one prompt, for the gateway to pass through.

    python header_upstream.py PORT
"""

import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("header-upstream")


@server.tool()
def whoami(ctx: Context) -> str:
    """Whether this request carried the expected bearer secret."""
    request = ctx.request_context.request
    sent = request.headers.get("authorization", "") if request is not None else ""
    if not sent:
        return "no authorization header"
    return "authorized" if sent == f"Bearer {os.environ['EXPECTED_SECRET']}" else "a wrong authorization header"


@server.resource("note://runbook")
def runbook() -> str:
    """A resource the gateway passes through unchanged."""
    return "restart the worker, then check the lease"


@server.prompt()
def review(change: str) -> str:
    """A prompt the gateway passes through unchanged."""
    return f"Review this change: {change}"


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
