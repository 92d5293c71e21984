"""fenceline-mcp and the tenant's authority (issue 37, items 3-6): the tenant's contract decides
the class and a strict policy refuses a tool without one; an approval-required call waits (with
progress notifications) and proceeds once a person approves, or is refused when they deny; a
capability budget of one call refuses the second; a secret in the arguments never leaves, one
in a result is redacted and the chain records that it was, without the value."""

import subprocess

import anyio
import anyio.to_thread

from approvals.models import ApprovalRequest
from approvals.services.approvals import approval_decide
from ledger.models import Event, Operation, Run
from tests.clients.gateway.conftest import commits, git, git_upstream
from tests.factories import GITHUB_PAT, set_policy
from tests.helpers import tables_containing


def text(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "text", None) is not None)


def ops_of(external_id: str) -> list[Operation]:
    return list(Operation.objects.filter(run__external_id=external_id).order_by("created_at"))


def test_the_tenants_contract_gives_the_class_and_a_strict_policy_refuses_a_tool_without_one(gateway, repo, acme):
    set_policy(
        acme.tenant,
        tool_contracts=[{"tool": "git_status", "effect_class": "PURE", "provider": "github"}],
        unknown_tool_class="REFUSE",
    )

    async def scenario():
        async with gateway.session("--external-id", "mcp-strict", upstream=git_upstream(repo)) as mcp:
            status = await mcp.call_tool("git_status", {"repo_path": str(repo)})
            log = await mcp.call_tool("git_log", {"repo_path": str(repo)})
            return status, log

    status, log = anyio.run(scenario)
    assert not status.is_error
    assert log.is_error and text(log).startswith("DENY_POLICY: ") and "\n" not in text(log)
    (op,) = ops_of("mcp-strict")
    # the contract's class, not the hint's IDEMPOTENT; the contract's provider, not the upstream's name
    assert (op.tool, op.effect_class, op.provider) == ("git_status", "PURE", "github")


def _approval_scenario(gateway, repo, approver, external_id: str, *, approve: bool):
    (repo / "notes.txt").write_text("one\n")
    progress: list[tuple[float, str | None]] = []
    first_progress = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))
        first_progress.set()

    def decide() -> None:
        approval = ApprovalRequest.objects.get(run__external_id=external_id, status="PENDING")
        approval_decide(approval_id=approval.pk, approve=approve, reason="checked the diff", user=approver)

    async def scenario():
        async with gateway.session("--external-id", external_id, upstream=git_upstream(repo)) as mcp:
            await mcp.call_tool("git_add", {"repo_path": str(repo), "files": ["notes.txt"]})
            async with anyio.create_task_group() as group:

                async def approver_decides_once_the_host_hears_of_the_wait():
                    await first_progress.wait()
                    await anyio.to_thread.run_sync(decide)

                group.start_soon(approver_decides_once_the_host_hears_of_the_wait)
                args = {"repo_path": str(repo), "message": "approved notes"}
                return await mcp.call_tool("git_commit", args, progress_callback=on_progress)

    return anyio.run(scenario), progress


def test_an_approval_required_write_waits_and_proceeds_once_a_person_approves(gateway, repo, acme, approver):
    set_policy(acme.tenant, human_approval_tools=["git_commit"])
    result, progress = _approval_scenario(gateway, repo, approver, "mcp-approve", approve=True)
    assert not result.is_error
    assert progress and "waiting for a person to approve git_commit" in (progress[0][1] or "")
    assert commits(repo) == 2
    commit = [op for op in ops_of("mcp-approve") if op.tool == "git_commit"]
    assert [op.phase for op in commit] == ["CONFIRMED"]


def test_a_denied_approval_is_refused_and_git_never_sees_the_write(gateway, repo, acme, approver):
    set_policy(acme.tenant, human_approval_tools=["git_commit"])
    result, _ = _approval_scenario(gateway, repo, approver, "mcp-deny", approve=False)
    assert result.is_error and text(result).startswith("APPROVAL_DENIED: checked the diff")
    assert commits(repo) == 1


def test_a_capability_budget_of_one_call_refuses_the_second(gateway, repo):
    config = {"tools": {"git_status": {"action": "status", "resource": "repo:widgets", "budget": {"max_calls": 1}}}}

    async def scenario():
        async with gateway.session("--external-id", "mcp-budget", upstream=git_upstream(repo), config=config) as mcp:
            first = await mcp.call_tool("git_status", {"repo_path": str(repo)})
            second = await mcp.call_tool("git_status", {"repo_path": str(repo)})
            return first, second

    first, second = anyio.run(scenario)
    assert not first.is_error
    assert second.is_error and text(second).startswith("DENY_BUDGET: ") and "capability:calls" in text(second)
    assert [(op.action, op.resource, op.phase) for op in ops_of("mcp-budget")] == [
        ("status", "repo:widgets", "CONFIRMED"),
        ("status", "repo:widgets", "DENIED"),
    ]


def test_a_secret_in_the_arguments_never_leaves_the_gateway(gateway, repo):
    (repo / "notes.txt").write_text("one\n")
    git(repo, "add", "notes.txt")

    async def scenario():
        async with gateway.session("--external-id", "mcp-arg-secret", upstream=git_upstream(repo)) as mcp:
            return await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": f"token {GITHUB_PAT}"})

    refused = anyio.run(scenario)
    assert refused.is_error and text(refused).startswith("FORBIDDEN_FIELD: arguments.message looks like a credential")
    assert GITHUB_PAT not in text(refused)
    assert commits(repo) == 1 and ops_of("mcp-arg-secret") == []


def test_a_secret_in_a_result_is_redacted_and_the_chain_records_it_without_the_value(gateway, repo):
    subprocess.run(
        ["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", f"deploy key {GITHUB_PAT}"], check=True
    )

    async def scenario():
        async with gateway.session("--external-id", "mcp-redact", upstream=git_upstream(repo)) as mcp:
            return await mcp.call_tool("git_log", {"repo_path": str(repo)})

    log = anyio.run(scenario)
    assert not log.is_error
    assert GITHUB_PAT not in text(log) and "deploy key [redacted:github_token]" in text(log)
    (op,) = ops_of("mcp-redact")
    (redacted,) = Event.objects.filter(run=Run.objects.get(external_id="mcp-redact"), type="x.mcp.redacted")
    assert redacted.fields == {"tool": "git_log", "operation_id": str(op.pk), "kinds": ["github_token"], "count": 1}
    assert tables_containing(GITHUB_PAT) == []
