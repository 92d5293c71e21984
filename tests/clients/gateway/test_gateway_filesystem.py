"""fenceline-mcp in front of two upstreams at once, one of them @modelcontextprotocol/server-filesystem
from npm run with node (issue 37, item 7): the tools are named <upstream>__<tool>, a write_file and
a move_file are operations, a write retried after the gateway restarts lands once, a secret read
from a file is redacted."""

import anyio

from ledger.models import Event, Operation
from tests.clients.gateway.conftest import filesystem_upstream, git_upstream
from tests.factories import GITHUB_PAT


def text(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "text", None) is not None)


def two_upstreams(repo, folder) -> dict:
    return {
        "upstreams": {
            "git": {"command": git_upstream(repo)},
            "fs": {"command": filesystem_upstream(folder)},
        },
        "tools": {"fs__write_file": {"action": "write", "resource_from": "path", "resource_prefix": "file:"}},
    }


def test_two_upstreams_are_named_apart_and_a_file_write_and_move_are_operations(gateway, repo, tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    target = folder / "plan.md"

    async def scenario():
        async with gateway.session("--external-id", "mcp-fs", config=two_upstreams(repo, folder)) as mcp:
            names = [tool.name for tool in (await mcp.list_tools()).tools]
            wrote = await mcp.call_tool("fs__write_file", {"path": str(target), "content": "step 1\n"})
            moved = await mcp.call_tool(
                "fs__move_file", {"source": str(target), "destination": str(folder / "done.md")}
            )
            status = await mcp.call_tool("git__git_status", {"repo_path": str(repo)})
            return names, wrote, moved, status

    names, wrote, moved, status = anyio.run(scenario)
    assert {"git__git_status", "git__git_commit", "fs__write_file", "fs__move_file", "fs__read_text_file"} <= set(names)
    assert all(name.startswith(("git__", "fs__")) for name in names)
    assert not wrote.is_error and not moved.is_error and not status.is_error
    assert (folder / "done.md").read_text() == "step 1\n" and not target.exists()
    ops = {op.tool: op for op in Operation.objects.filter(run__external_id="mcp-fs")}
    assert (ops["fs__write_file"].action, ops["fs__write_file"].resource) == ("write", f"file:{target}")
    assert (ops["fs__move_file"].provider, ops["fs__move_file"].effect_class) == ("fs", "NON_RETRYABLE")
    assert ops["git__git_status"].provider == "git"
    (started,) = Event.objects.filter(run__external_id="mcp-fs", type="x.mcp.session")
    assert started.fields["upstreams"] == ["git", "fs"]


def test_a_file_write_retried_after_the_gateway_restarts_lands_once(gateway, repo, tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    target = folder / "counter.txt"

    async def attempt():
        async with gateway.session("--external-id", "mcp-fs-retry", config=two_upstreams(repo, folder)) as mcp:
            return await mcp.call_tool("fs__write_file", {"path": str(target), "content": "1\n"})

    first = anyio.run(attempt)
    target.write_text("changed by someone else\n")  # a repeated write would overwrite this
    again = anyio.run(attempt)
    # write_file declares an output schema: a replay without its structured content is sent as an error
    assert not first.is_error and again.is_error and text(again).startswith("ALREADY_CONFIRMED:")
    assert target.read_text() == "changed by someone else\n"
    assert Operation.objects.filter(run__external_id="mcp-fs-retry").count() == 1


def test_a_secret_read_from_a_file_is_redacted(gateway, repo, tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / ".env").write_text(f"GITHUB_TOKEN={GITHUB_PAT}\nREGION=eu\n")

    async def scenario():
        async with gateway.session("--external-id", "mcp-fs-secret", config=two_upstreams(repo, folder)) as mcp:
            return await mcp.call_tool("fs__read_text_file", {"path": str(folder / ".env")})

    read = anyio.run(scenario)
    assert not read.is_error
    assert GITHUB_PAT not in text(read) and "GITHUB_TOKEN=[redacted:github_token]" in text(read)
    assert "REGION=eu" in text(read)
    (redacted,) = Event.objects.filter(run__external_id="mcp-fs-secret", type="x.mcp.redacted")
    assert redacted.fields["tool"] == "fs__read_text_file" and redacted.fields["count"] >= 1
