"""fenceline-mcp and credential leases (issue 37, item 5): a tool whose gateway contract asks for
a credential is called under a lease scoped to the call; the secret the lease's reference names
reaches the upstream only through its configured channel (here the environment of
mcp-server-git, read by a git hook), never the arguments, the logs or the database; a revoked
lease is refused at authorize and ends that upstream session."""

import os
import socket
import subprocess
import sys
import time
import uuid

import anyio

from ledger.models import CredentialLease, Operation
from ledger.services.authority.credential_leases import credential_lease_revoke
from ledger.services.authority.credentials import credential_create
from tests.clients.gateway.conftest import HERE, commits, git, git_server_pids, git_upstream
from tests.helpers import tables_containing
from tests.served import free_port


def text(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "text", None) is not None)


def test_a_credentialed_write_gets_the_secret_through_the_upstreams_environment_only(gateway, repo, acme, tmp_path):
    secret = "deploy-" + uuid.uuid4().hex
    credential_create(tenant=acme.tenant, principal="deploy-bot", secret_ref="env:DEPLOY_BOT_TOKEN")
    seen = tmp_path / "seen-by-hook"
    hook = repo / ".git/hooks/pre-commit"
    hook.write_text(f'#!/bin/sh\nprintf %s "$GITHUB_TOKEN" > {seen}\n')
    hook.chmod(0o755)
    config = {
        "upstreams": {
            "git": {"command": git_upstream(repo), "credential": {"principal": "deploy-bot", "env": "GITHUB_TOKEN"}}
        },
        "tools": {"git_commit": {"action": "commit", "resource": "repo:widgets", "credential": True}},
    }

    def stage(name: str) -> None:
        (repo / name).write_text(name)
        git(repo, "add", name)

    async def scenario():
        async with gateway.session("--external-id", "mcp-cred", config=config, env={"DEPLOY_BOT_TOKEN": secret}) as mcp:
            stage("a.txt")
            first = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "a"})
            served_by = git_server_pids(repo)
            (lease,) = CredentialLease.objects.filter(run__external_id="mcp-cred")
            credential_lease_revoke(tenant=acme.tenant, lease_id=lease.pk, reason="rotated", revoked_by="ada")
            stage("b.txt")
            revoked = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "b"})
            after_revocation = git_server_pids(repo)
            again = await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "b"})
            return first, served_by, revoked, after_revocation, again

    first, served_by, revoked, after_revocation, again = anyio.run(scenario)
    assert not first.is_error and seen.read_text() == secret  # the upstream's environment had it
    assert revoked.is_error and text(revoked).startswith("DENY_REVOKED: ")
    assert served_by and not set(served_by) & set(after_revocation)  # that upstream session ended
    assert not again.is_error and commits(repo) == 3  # a new lease, a new upstream session
    leases = CredentialLease.objects.filter(run__external_id="mcp-cred").order_by("issued_at")
    assert [(lease.actions, lease.resources) for lease in leases] == [(["commit"], ["repo:widgets"])] * 2
    assert [op.phase for op in Operation.objects.filter(run__external_id="mcp-cred").order_by("created_at")] == [
        "CONFIRMED",
        "DENIED",
        "CONFIRMED",
    ]
    assert tables_containing(secret) == []
    assert secret not in (tmp_path / "gateway.log").read_text()


def test_an_http_upstream_gets_the_secret_in_its_header_and_only_under_a_lease(gateway, acme, tmp_path):
    secret = "docs-" + uuid.uuid4().hex
    credential_create(tenant=acme.tenant, principal="docs-bot", secret_ref=f"file:{tmp_path / 'docs-secret'}")
    (tmp_path / "docs-secret").write_text(secret + "\n")
    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "header_upstream.py"), str(port)],
        env={"PATH": os.environ.get("PATH", ""), "EXPECTED_SECRET": secret},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    config = {
        "upstreams": {
            "docs": {
                "url": f"http://127.0.0.1:{port}/mcp",
                "credential": {"principal": "docs-bot", "header": "Authorization", "prefix": "Bearer "},
            }
        },
        "tools": {"whoami": {"credential": True}},
    }
    try:
        wait_for_port(port)

        async def scenario():
            async with gateway.session("--external-id", "mcp-header", config=config) as mcp:
                return await mcp.call_tool("whoami", {})

        answer = anyio.run(scenario)
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
    assert not answer.is_error and text(answer) == "authorized"
    (lease,) = CredentialLease.objects.filter(run__external_id="mcp-header")
    assert (lease.actions, lease.resources) == (["whoami"], ["docs"])
    assert tables_containing(secret) == []


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}")
