"""The LangGraph adapter (``pip install 'fenceline-client[langgraph]'``; docs/langgraph.md): a
tool node whose calls are fenced operations of one Fenceline run, and a way to run the graph
under the run's lease so that Fenceline's progress checkpoint and LangGraph's checkpointer agree
on where to resume.

    fenced = FencedGraph(client, run_id)
    builder.add_node("tools", fenced.tool_node([fenced.tool(charge, action="charge",
                     resource=lambda args: f"customer:{args['customer']}", effect_class="NON_RETRYABLE")]))
    graph = builder.compile(checkpointer=InMemorySaver())
    with fenced:
        fenced.invoke(graph, {"messages": [...]})          # pauses on an approval: fenced.waiting(graph)
    with FencedGraph(client, run_id) as fenced:           # later: from the checkpoint Fenceline holds
        fenced.invoke(graph, Command(resume="decided"))

The contract: at every LangGraph checkpoint (each super-step) ``invoke`` saves a Fenceline
progress checkpoint whose state is ``{"langgraph": {"thread_id", "checkpoint_ns",
"checkpoint_id"}, "step", "next"}``; whoever takes the run's lease next resumes the graph from
exactly that LangGraph checkpoint (``config``), never from a later one Fenceline did not see.
Steps between the two are run again, and their tool calls replay (``fencing``), so an effect
CONFIRMED before the resume point is not repeated. A checkpoint Fenceline names that the
checkpointer does not hold raises ``CheckpointMissing`` instead of starting over.

A call that needs a person raises LangGraph's ``interrupt`` with ``{"approval_id",
"operation_id", "tool", "args", "idempotency_key"}``; ``Command(resume=...)`` after the decision
runs the node again (LangGraph's way): calls already CONFIRMED replay, the approved one runs, a
call still waiting interrupts again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.pregel import Pregel
from langgraph.types import interrupt

from fenceline_client.adapters import fencing
from fenceline_client.client import ApprovalDenied, Client, Denied, Effect, Lease

__all__ = ["ApprovalPending", "CheckpointMissing", "EffectUncertain", "FencedGraph", "FencedGraphTool", "Reported"]

ApprovalPending = fencing.ApprovalPending
EffectUncertain = fencing.EffectUncertain
Reported = fencing.Reported
POSITION = "langgraph step {step}"


class CheckpointMissing(LookupError):
    """Fenceline's progress checkpoint names a LangGraph checkpoint the checkpointer does not
    hold (another database, or one that was lost): nothing is resumed from a guess."""


@dataclass(frozen=True)
class FencedGraphTool:
    """A tool of the fenced tool node: its name, its function (called with the call's
    arguments as keywords) and how its calls become operations."""

    name: str
    function: Callable[..., Any]
    spec: fencing.FencedTool


def _history(messages: Iterable[BaseMessage]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (str(call["id"]), call["name"], dict(call["args"]))
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.tool_calls
        if call.get("id")
    ]


class FencedGraph:
    """One Fenceline run for a LangGraph thread (the run id unless ``thread_id`` is given):
    a context manager holding the run's lease, the factory of the fenced tool node, and
    ``invoke``, which runs the graph and saves a progress checkpoint per LangGraph checkpoint."""

    def __init__(
        self, client: Client, run_id: str, *, thread_id: str | None = None, ttl_s: int = 30, owner_id: str | None = None
    ) -> None:
        self.client, self.run_id, self.thread_id = client, run_id, thread_id or run_id
        self.ttl_s, self.owner_id = ttl_s, owner_id
        self._lease: Lease | None = None

    def __enter__(self) -> FencedGraph:
        self._lease = self.client.lease(self.run_id, ttl_s=self.ttl_s, owner_id=self.owner_id)
        self._lease.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lease is not None:
            self._lease.__exit__(*exc)

    @property
    def lease(self) -> Lease:
        if self._lease is None:
            raise RuntimeError("the fenced graph runs inside `with FencedGraph(...)`: it holds no lease")
        return self._lease

    # -- the tool node --

    def tool(
        self,
        function: Callable[..., Any],
        *,
        action: str,
        resource: str | Callable[[dict[str, Any]], str],
        effect_class: str | None = None,
        name: str | None = None,
        **intent: Any,
    ) -> FencedGraphTool:
        """A tool whose calls are operations (``action`` on ``resource``, text or a function of
        the arguments). The function may return ``Reported(output, Done(...))``."""
        return FencedGraphTool(
            name or function.__name__, function, fencing.FencedTool(action, resource, effect_class, dict(intent))
        )

    def tool_node(self, tools: Sequence[FencedGraphTool]) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A node for a graph whose state has ``messages``: it runs the tool calls of the last
        AI message as fenced operations and answers with one ToolMessage each."""
        by_name = {tool.name: tool for tool in tools}

        def node(state: dict[str, Any]) -> dict[str, Any]:
            messages = state["messages"]
            ordinals = fencing.Ordinals()
            ordinals.observe(_history(messages))
            last = messages[-1]
            calls = last.tool_calls if isinstance(last, AIMessage) else []
            return {"messages": [self._answer(by_name, call, ordinals) for call in calls]}

        return node

    def _answer(self, tools: dict[str, FencedGraphTool], call: Any, ordinals: fencing.Ordinals) -> ToolMessage:
        call_id, name, args = str(call["id"]), call["name"], dict(call["args"])
        tool = tools.get(name)
        if tool is None:
            return ToolMessage(f"no such tool: {name}", tool_call_id=call_id, name=name, status="error")
        ordinal = ordinals.of(call_id) or 0
        try:
            output = self._call(tool, args, ordinal)
        except (Denied, ApprovalDenied) as refused:
            return ToolMessage(
                f"Fenceline refused this call: {refused}", tool_call_id=call_id, name=name, status="error"
            )
        content = output if isinstance(output, str) else json.dumps(output, default=str)
        return ToolMessage(content, tool_call_id=call_id, name=name)

    def _call(self, tool: FencedGraphTool, args: dict[str, Any], ordinal: int) -> Any:
        key = fencing.idempotency_key(self.run_id, tool.name, args, ordinal)
        effect: Effect = fencing.start(self.lease, tool=tool.name, args=args, ordinal=ordinal, spec=tool.spec)
        while effect.phase == "PENDING_APPROVAL" and effect.approval_id is not None:
            interrupt(
                {
                    "approval_id": effect.approval_id,
                    "operation_id": effect.operation_id,
                    "tool": tool.name,
                    "args": args,
                    "idempotency_key": key,
                }
            )
            effect = fencing.start(self.lease, tool=tool.name, args=args, ordinal=ordinal, spec=tool.spec)
        return fencing.finish(self.lease, effect, tool=tool.name, key=key, perform=lambda: tool.function(**args))

    # -- running and resuming --

    @property
    def config(self) -> RunnableConfig:
        """The graph's config for this run: its thread and, once Fenceline holds a progress
        checkpoint of it, that exact LangGraph checkpoint."""
        configurable: dict[str, Any] = {"thread_id": self.thread_id}
        saved = (self.lease.checkpoint_state or {}).get("langgraph")
        if saved:
            if saved.get("thread_id") != self.thread_id:
                raise CheckpointMissing(f"Fenceline's checkpoint is of thread {saved.get('thread_id')!r}")
            configurable.update(checkpoint_ns=saved["checkpoint_ns"], checkpoint_id=saved["checkpoint_id"])
        return RunnableConfig(configurable=configurable)

    def invoke(self, graph: Pregel[Any, Any], input: Any, **kwargs: Any) -> dict[str, Any]:
        """Run ``graph`` (compiled with a checkpointer) from where Fenceline's checkpoint says,
        saving a progress checkpoint at each of LangGraph's; returns the last values (with
        ``__interrupt__`` when it paused: ``waiting``)."""
        config = self.config
        configurable = config.get("configurable", {})
        checkpointer = graph.checkpointer
        if "checkpoint_id" in configurable and (
            not isinstance(checkpointer, BaseCheckpointSaver) or checkpointer.get_tuple(config) is None
        ):
            raise CheckpointMissing(f"the checkpointer holds no checkpoint {configurable['checkpoint_id']}")
        values: dict[str, Any] = {}
        for mode, event in graph.stream(input, config, stream_mode=["checkpoints", "values"], **kwargs):
            if mode == "checkpoints":
                self._save(event)
            else:
                values = event
        return values

    def _save(self, event: dict[str, Any]) -> None:
        configurable = event["config"]["configurable"]
        step = event["metadata"].get("step", 0)
        saved = {
            "langgraph": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                "checkpoint_id": configurable["checkpoint_id"],
            },
            "step": step,
            "next": list(event.get("next") or ()),
        }
        self.lease.checkpoint(POSITION.format(step=step), saved)

    def waiting(self, graph: Pregel[Any, Any]) -> list[dict[str, Any]]:
        """The approvals the graph's thread is paused on (the interrupts' values)."""
        state = graph.get_state(self.config)
        return [item.value for item in state.interrupts if isinstance(item.value, dict) and "approval_id" in item.value]

    def wait(self, graph: Pregel[Any, Any], *, timeout_s: float = 600, poll_s: float = 2.0) -> None:
        """Until a person has decided every approval the thread is paused on (the lease renews
        meanwhile); then ``invoke(graph, Command(resume=...))`` goes on. ApprovalDenied on the
        timeout."""
        deadline = time.monotonic() + timeout_s
        while any(
            self.client.get(f"/approvals/{waiting['approval_id']}")["status"] == "PENDING"
            for waiting in self.waiting(graph)
        ):
            if time.monotonic() >= deadline:
                raise ApprovalDenied(408, {"error": "APPROVAL_DENIED", "detail": "no decision before the timeout"})
            time.sleep(poll_s)
