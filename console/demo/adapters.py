"""Two agent runs as the framework adapters write them (docs/openai-agents.md,
docs/langgraph.md), seeded through the services without the frameworks (the demo does not need
the client's extras): every tool call an operation under the adapters' idempotency key
(``fenceline_client.adapters.fencing``, which imports no framework), its output kept in an
``x.tool_result`` event for replays.

- An OpenAI Agents SDK run (external id ``openai-agents:support-desk``): a customer looked up
  and a note written, CONFIRMED; a refund waiting for a person, the SDK's interruption.
- A LangGraph run (``langgraph:billing-triage``): the same two calls, a progress checkpoint at
  each of LangGraph's checkpoints in the state shape the adapter saves, then completed.

The tools' contracts join the tenant's policy; refunds need a person."""

import contextlib
import uuid
from collections.abc import Callable
from typing import Any

from console.demo.acting import Acting
from fenceline_client.adapters.fencing import RESULT_EVENT, args_digest, idempotency_key
from ledger.errors import ApprovalRequired
from ledger.models import Operation, Run
from ledger.services.authority.policy import policy_change, policy_current
from ledger.services.core.intent import Intent
from ledger.services.fence import notes, operations, runs
from ledger.services.lifespan.checkpoints import checkpoint_save
from ledger.states import Outcome

CONTRACTS = [
    {"tool": "crm_lookup", "action": "*", "effect_class": "PURE"},
    {"tool": "crm_note", "action": "*", "effect_class": "IDEMPOTENT"},
    {"tool": "crm_refund", "action": "*", "effect_class": "NON_RETRYABLE"},
]
LOOKUP = {"customer": "881"}
NOTE = {"customer": "881", "text": "asked for a refund of order 5521"}
REFUND = {"customer": "881", "cents": 1299}


def seed(acting: Acting, say: Callable[[str], None]) -> None:
    _, policy = policy_current(tenant=acting.tenant)
    policy_change(
        tenant=acting.tenant,
        document={
            **policy,
            "human_approval_tools": [*policy["human_approval_tools"], "crm_refund"],
            "tool_contracts": [*policy["tool_contracts"], *CONTRACTS],
        },
        changed_by="admin",
        reason="the agents' CRM tools: lookups PURE, notes IDEMPOTENT, refunds NON_RETRYABLE and for a person",
    )
    agent_run(acting, say)
    graph_run(acting, say)


def agent_run(acting: Acting, say: Callable[[str], None]) -> None:
    run, token = acting.leased("openai-agents:support-desk", owner=f"owner-{uuid.uuid4().hex[:12]}")
    confirmed(acting, run, token, "crm_lookup", "read", LOOKUP, "customer 881: in good standing")
    confirmed(acting, run, token, "crm_note", "write", NOTE, "noted on 881")
    refund = intend(acting, run, token, "crm_refund", "refund", REFUND)
    with contextlib.suppress(ApprovalRequired):  # the SDK's interruption: it waits on the approvals page
        operations.operation_authorize(worker=acting.worker, operation_id=refund.pk, fencing_token=token)
    say(f"OpenAI Agents SDK run {run.external_id}: {summary(run)}")


def graph_run(acting: Acting, say: Callable[[str], None]) -> None:
    run, token = acting.leased("langgraph:billing-triage", owner=f"owner-{uuid.uuid4().hex[:12]}")
    checkpoint(acting, run, token, step=-1, next_nodes=["__start__"])  # LangGraph's input checkpoint
    checkpoint(acting, run, token, step=0, next_nodes=["model"])
    checkpoint(acting, run, token, step=1, next_nodes=["tools"])
    confirmed(acting, run, token, "crm_lookup", "read", LOOKUP, "customer 881: in good standing")
    confirmed(acting, run, token, "crm_note", "write", NOTE, "noted on 881")
    checkpoint(acting, run, token, step=2, next_nodes=["model"])
    checkpoint(acting, run, token, step=3, next_nodes=[])
    runs.run_complete(worker=acting.worker, run_id=run.pk, fencing_token=token)
    say(f"LangGraph run {run.external_id}: {summary(run)}, 5 progress checkpoints, completed")


def summary(run: Run) -> str:
    phases = sorted(Operation.objects.filter(run=run).values_list("phase", flat=True))
    return f"{len(phases)} tool calls ({', '.join(phases)})"


def checkpoint(acting: Acting, run: Run, token: int, *, step: int, next_nodes: list[str]) -> None:
    """The progress checkpoint ``FencedGraph.invoke`` saves at one of LangGraph's checkpoints."""
    state = {
        "langgraph": {"thread_id": str(run.pk), "checkpoint_ns": "", "checkpoint_id": str(uuid.uuid4())},
        "step": step,
        "next": next_nodes,
    }
    checkpoint_save(
        worker=acting.worker, run_id=run.pk, fencing_token=token, position=f"langgraph step {step}", state=state
    )


def intend(acting: Acting, run: Run, token: int, tool: str, action: str, args: dict[str, Any]) -> Operation:
    """The intent a fenced tool states (``fencing.start``): the contract gives the effect class."""
    intent = Intent(
        tool=tool,
        action=action,
        resource=f"customer:{args['customer']}",
        effect_class=None,
        idempotency_key=idempotency_key(str(run.pk), tool, args, 0),
        args_digest=args_digest(args),
    )
    return operations.operation_intend(worker=acting.worker, run_id=run.pk, fencing_token=token, intent=intent)[0]


def confirmed(acting: Acting, run: Run, token: int, tool: str, action: str, args: dict[str, Any], output: str) -> None:
    """A call the tool's function answered: CONFIRMED, its output kept for replays."""
    op = intend(acting, run, token, tool, action, args)
    operations.operation_authorize(worker=acting.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=acting.worker, operation_id=op.pk, fencing_token=token)
    acting.outcome(op, token, Outcome.CONFIRMED)
    notes.event_append(
        worker=acting.worker,
        run_id=run.pk,
        fencing_token=token,
        type=RESULT_EVENT,
        fields={"operation_id": str(op.pk), "tool": tool},
        payload={"output": output},
    )
