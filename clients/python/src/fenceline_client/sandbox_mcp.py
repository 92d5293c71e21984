"""A small MCP server over stdio for the simulator and the gateway benchmark: a notebook of
key/value notes kept in memory, on the official MCP SDK's ``MCPServer``.

    python -m fenceline_client.sandbox_mcp

Tools (their annotations are the upstream's own hints; a tenant's tool contract decides):

    note_read(key)           read-only: the note, or "" when there is none
    note_write(key, value)   a write (idempotent: the same key and value twice is one note)
    note_append(key, value)  a write that is not idempotent (each call appends a line)

It does nothing else and keeps nothing once it exits: what it answers is cheap and constant, so
that a benchmark measures the gateway and not the upstream.
"""

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("fenceline-sandbox")
notes: dict[str, str] = {}


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def note_read(key: str) -> str:
    """The note kept under ``key`` ("" when there is none)."""
    return notes.get(key, "")


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
def note_write(key: str, value: str) -> str:
    """Keep ``value`` under ``key``, replacing what was there."""
    notes[key] = value
    return f"kept {len(value)} characters under {key}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False))
def note_append(key: str, value: str) -> str:
    """Append ``value`` as a new line of the note under ``key``."""
    notes[key] = f"{notes[key]}\n{value}" if key in notes else value
    return f"{key} has {notes[key].count(chr(10)) + 1} lines"


def main() -> None:
    server.run("stdio")


if __name__ == "__main__":
    main()
