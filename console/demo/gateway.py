"""An MCP session through ``fenceline-mcp``, as the gateway records it: Claude Desktop in
front of mcp-server-git. The session is one run (external id ``mcp:claude-desktop:<session>``)
whose first event names the client, protocol version and upstream; every ``tools/call`` is an
operation named after the tool, with the digest of its arguments: a status read and a commit
CONFIRMED, a log read whose result carried a token (redacted before it reached the model), a
commit whose upstream connection dropped after dispatch (UNKNOWN, with its case) and a push
waiting for a person. The git tools' contracts join the tenant's policy; pushes need approval."""

import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from console.demo.acting import Acting
from ledger.errors import ApprovalRequired
from ledger.models import Operation, Run
from ledger.services.authority.policy import policy_change, policy_current
from ledger.services.core.intent import Intent
from ledger.services.fence import notes, operations
from ledger.states import Outcome

SESSION = "a41c9e7d2b"
UPSTREAM = "git"  # the gateway names an upstream; its command stays in the gateway's config
CONTRACTS = [
    {"tool": "git_status", "action": "*", "effect_class": "PURE"},
    {"tool": "git_log", "action": "*", "effect_class": "PURE"},
    {"tool": "git_commit", "action": "*", "effect_class": "NON_RETRYABLE"},
    {"tool": "git_push", "action": "*", "effect_class": "NON_RETRYABLE"},
]


def seed(acting: Acting, say: Callable[[str], None]) -> None:
    _, policy = policy_current(tenant=acting.tenant)
    policy_change(
        tenant=acting.tenant,
        document={
            **policy,
            "human_approval_tools": [*policy["human_approval_tools"], "git_push"],
            "tool_contracts": [*policy["tool_contracts"], *CONTRACTS],
        },
        changed_by="admin",
        reason="the MCP gateway's git tools: reads are PURE, commits and pushes NON_RETRYABLE; pushes need a person",
    )
    run, token = acting.leased(f"mcp:claude-desktop:{SESSION}", owner=f"mcp-{SESSION}")
    session = {
        "session_id": SESSION,
        "client_name": "claude-desktop",
        "client_version": "0.14.2",
        "protocol_version": "2025-06-18",
        "upstreams": [UPSTREAM],
    }
    notes.event_append(worker=acting.worker, run_id=run.pk, fencing_token=token, type="x.mcp.session", fields=session)
    repo = {"repo_path": "/srv/acme-web"}
    status = call(acting, run, token, "git_status", repo)
    acting.outcome(status, token, Outcome.CONFIRMED, provider_request_id=answered("On branch main"))
    log = call(acting, run, token, "git_log", {**repo, "max_count": 5})
    acting.outcome(log, token, Outcome.CONFIRMED, provider_request_id=answered("Commit history: ..."))
    redacted = {"tool": "git_log", "operation_id": str(log.pk), "kinds": ["github_token"], "count": 1}
    notes.event_append(worker=acting.worker, run_id=run.pk, fencing_token=token, type="x.mcp.redacted", fields=redacted)
    commit = call(acting, run, token, "git_commit", {**repo, "message": "Fix the checkout total"})
    acting.outcome(commit, token, Outcome.CONFIRMED, provider_request_id=answered("Changes committed: 3f9a2c1"))
    dropped = call(acting, run, token, "git_commit", {**repo, "message": "Bump the version"})
    acting.outcome(dropped, token, Outcome.UNKNOWN)  # the upstream's connection dropped after dispatch
    push = intend(acting, run, token, "git_push", {**repo, "remote": "origin", "branch": "main"})
    with contextlib.suppress(ApprovalRequired):  # it waits for a person on the approvals page
        operations.operation_authorize(worker=acting.worker, operation_id=push.pk, fencing_token=token)
    phases = Counter(Operation.objects.filter(run=run).values_list("phase", flat=True))
    say(
        f"MCP gateway session {run.external_id}: {sum(phases.values())} tool calls "
        f"({', '.join(f'{n} {phase}' for phase, n in sorted(phases.items()))})"
    )


def canonical(arguments: dict[str, Any]) -> str:
    """A call's arguments as the gateway digests them (docs/gateway.md: canonical JSON). Spelled
    here, not imported: the gateway and its SDK are the client's optional extra, the demo is not."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def answered(text: str) -> str:
    """What the gateway reports as a call's provider request id: the digest of the upstream's result."""
    return digest(canonical({"content": [{"type": "text", "text": text}], "isError": False}))


def intend(acting: Acting, run: Run, token: int, tool: str, arguments: dict[str, Any]) -> Operation:
    """The intent the gateway states for a call (``fenceline_client.gateway``): the tool, the
    upstream as its resource and provider, the arguments' digest and a key stable for a
    retried call."""
    return operations.operation_intend(
        worker=acting.worker,
        run_id=run.pk,
        fencing_token=token,
        intent=_intent(run, tool, arguments),
    )[0]


def call(acting: Acting, run: Run, token: int, tool: str, arguments: dict[str, Any]) -> Operation:
    """Intend, authorize and dispatch one tool call (nothing waits for a person)."""
    op = intend(acting, run, token, tool, arguments)
    operations.operation_authorize(worker=acting.worker, operation_id=op.pk, fencing_token=token)
    return operations.operation_dispatch(worker=acting.worker, operation_id=op.pk, fencing_token=token)


def _intent(run: Run, tool: str, arguments: dict[str, Any]) -> Intent:
    """The tool's contract gives the effect class (``effect_class=None``), not the upstream."""
    text = canonical(arguments)
    return Intent(
        tool=tool,
        action=tool,
        resource=UPSTREAM,
        effect_class=None,
        idempotency_key="mcp-" + hashlib.sha256(f"{run.pk}\n{tool}\n{text}\n0".encode()).hexdigest(),
        args_digest=digest(text),
        provider=UPSTREAM,
    )
