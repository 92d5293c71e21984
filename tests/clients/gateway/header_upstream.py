"""An upstream MCP server over streamable HTTP for the gateway's tests, built with the MCP SDK's
own ``MCPServer``: its one tool says whether the request carried ``Authorization: Bearer
<EXPECTED_SECRET>`` (the secret from its own environment), never the header's value.

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


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
