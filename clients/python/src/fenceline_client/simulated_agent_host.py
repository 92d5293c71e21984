"""An agent host of the fleet simulator (``manage.py simulate --agent-hosts N``) whose tools are
called through the framework adapters: an OpenAI Agents SDK agent (``adapters.openai_agents``)
and a LangGraph graph (``adapters.langgraph``) take turns, each driven by a scripted model (no
network, no LLM), each run one Fenceline run the host creates (external id
``agent:<framework>:<host>:<pid>:<n>``).

A run looks a customer up (``crm_lookup``, PURE), writes a note (``crm_note``, IDEMPOTENT) and
completes. The host's first run of each framework also asks for a refund (``crm_refund``,
NON_RETRYABLE, which the simulator's policy gives to a person): the SDK's interruption or the
graph's interrupt carries the Fenceline approval id, the host prints ``PAUSED <framework> <run>
<approval>`` and keeps holding the run's lease (a lease's end voids the approvals asked under
it), so the refund waits on the approvals page while the host lives: the simulator approves
nothing, and the host resumes nothing. Until SIGTERM; then the host releases the leases it
holds (the refunds' approvals become VOID), drains, reports its exit and prints ``RUNS
<completed> <paused>``.

    FENCELINE_URL, FENCELINE_TOKEN   the server and this host's worker token
    python -m fenceline_client.simulated_agent_host --name sim-agent-host-1 [--index 0] [--think 0.3]

Needs the extras ``fenceline-client[openai-agents,langgraph]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Usage, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from fenceline_client import client as fl
from fenceline_client.adapters.langgraph import FencedGraph
from fenceline_client.adapters.openai_agents import FencedAgentRun

FRAMEWORKS = ("openai-agents", "langgraph")
RUN_PREFIX = "agent:"
stopping = False


def on_sigterm(signum: int, frame: object) -> None:
    global stopping
    stopping = True  # the run in progress finishes, then the host stops


def say(*words: object) -> None:
    print(*words, flush=True)


# -- the tools (the simulated CRM, in this process) --


def crm_lookup(customer: str) -> str:
    """Look a customer up."""
    return f"customer {customer}: in good standing"


def crm_note(customer: str, text: str) -> str:
    """Write a note on a customer."""
    return f"noted on {customer}: {text}"


def crm_refund(customer: str, cents: int) -> str:
    """Refund a customer."""
    return f"refunded {customer} {cents}"


def by_customer(args: dict[str, Any]) -> str:
    return f"customer:{args['customer']}"


Turns = list[list[tuple[str, dict[str, Any]]]]  # the model's turns: its tool calls, each (tool, arguments)
SPECS: list[tuple[Any, str]] = [(crm_lookup, "read"), (crm_note, "write"), (crm_refund, "refund")]


def script(n: int, refund: bool) -> Turns:
    """The model's turns: a lookup and a note, then (when ``refund``) a refund, then the end."""
    customer = str(800 + n % 50)
    turns: Turns = [[("crm_lookup", {"customer": customer}), ("crm_note", {"customer": customer, "text": f"run {n}"})]]
    if refund:
        turns.append([("crm_refund", {"customer": customer, "cents": 500})])
    return turns


# -- the OpenAI Agents SDK --


class ScriptedModel(Model):
    """A model for the SDK that plays its turns (tool calls, then a final message)."""

    def __init__(self, turns: Turns) -> None:
        self.turns = list(turns)
        self.made = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        if not self.turns:
            text = ResponseOutputText(type="output_text", text="done", annotations=[])
            final = ResponseOutputMessage(
                type="message", id="msg", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[final], usage=Usage(), response_id=None)
        output: list[Any] = []
        for tool, arguments in self.turns.pop(0):
            self.made += 1
            call_id = f"call_{self.made}"
            output.append(
                ResponseFunctionToolCall(
                    type="function_call",
                    name=tool,
                    arguments=json.dumps(arguments),
                    call_id=call_id,
                    id=f"fc_{call_id}",
                )
            )
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def openai_run(held: contextlib.ExitStack, client: fl.Client, run_id: str, turns: Turns) -> str | None:
    """The agent run under a lease ``held`` keeps; the approval id it paused on, or None once
    it completed."""
    fenced = held.enter_context(FencedAgentRun(client, run_id, ttl_s=10))
    tools: list[Any] = [fenced.tool(function, action=action, resource=by_customer) for function, action in SPECS]
    agent = Agent(name="support", model=ScriptedModel(turns), tools=tools)
    result = fenced.run_sync(agent, "help customer")
    for item in result.interruptions:
        return fenced.approval_id(item)
    fenced.lease.complete()
    return None


# -- LangGraph --


def graph_run(held: contextlib.ExitStack, client: fl.Client, run_id: str, turns: Turns) -> str | None:
    """The graph's run under a lease ``held`` keeps; the approval id it paused on, or None
    once it completed."""
    script_messages = [
        AIMessage(
            "",
            tool_calls=[{"name": t, "args": a, "id": f"c{i}{j}", "type": "tool_call"} for j, (t, a) in enumerate(turn)],
        )
        for i, turn in enumerate(turns)
    ] + [AIMessage("done")]

    def model(state: MessagesState) -> dict[str, Any]:
        turn = sum(isinstance(message, AIMessage) for message in state["messages"])
        return {"messages": [script_messages[turn]]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    fenced = held.enter_context(FencedGraph(client, run_id, ttl_s=10))
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    tools: Any = fenced.tool_node([fenced.tool(function, action=a, resource=by_customer) for function, a in SPECS])
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=InMemorySaver())
    values = fenced.invoke(graph, {"messages": [HumanMessage("help customer")]})
    if values.get("__interrupt__"):
        return str(fenced.waiting(graph)[0]["approval_id"])
    fenced.lease.complete()
    return None


def host(held: contextlib.ExitStack, client: fl.Client, name: str, index: int, think_s: float) -> tuple[int, int]:
    """Runs until SIGTERM, the frameworks in turn: (completed, paused)."""
    completed = paused = n = 0
    asked: set[str] = set()
    while not stopping:
        framework = FRAMEWORKS[(index + n) % 2]
        run_id = client.create_run(external_id=f"{RUN_PREFIX}{framework}:{name}:{os.getpid()}:{n}")
        turns = script(n, refund=framework not in asked)
        asked.add(framework)
        waiting = (openai_run if framework == "openai-agents" else graph_run)(held, client, run_id, turns)
        if waiting is None:
            completed += 1
            say("COMPLETED", framework, run_id)
        else:
            paused += 1
            say("PAUSED", framework, run_id, waiting)
        n += 1
        time.sleep(think_s)
    return completed, paused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="this host's name (in its runs' external ids)")
    parser.add_argument("--index", type=int, default=0, help="0: the OpenAI agent first, 1: the graph first")
    parser.add_argument("--think", type=float, default=0.3, help="seconds between two runs (default 0.3)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    set_tracing_disabled(True)  # nothing is exported anywhere
    client = fl.Client(os.environ["FENCELINE_URL"], os.environ["FENCELINE_TOKEN"], timeout=10)
    with contextlib.ExitStack() as held:  # the paused runs' leases, released at the end
        completed, paused = host(held, client, args.name, args.index, args.think)
    say("RUNS", completed, paused)
    try:
        client.drain(deadline_s=5, reason="the agent host stopped")
        client.exit()
    except fl.FencelineError as refused_exit:
        say("EXIT_REFUSED", refused_exit.code)
    say("EXITED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
