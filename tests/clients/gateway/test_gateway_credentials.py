"""fenceline-mcp and credential leases (issue 37, item 5): a tool whose gateway contract asks for
a credential is called under a lease scoped to the call; the secret the lease's reference names
reaches the upstream only through its configured channel (here the environment of
mcp-server-git, read by a git hook), never the arguments, the logs or the database; a revoked
lease is refused at authorize and ends that upstream session."""

import uuid

import anyio

from ledger.models import CredentialLease, Operation
from ledger.services.authority.credential_leases import credential_lease_revoke
from ledger.services.authority.credentials import credential_create
from tests.clients.gateway.conftest import commits, git, git_server_pids, git_upstream
from tests.helpers import tables_containing


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
