"""The OpenAI Agents SDK adapter (``pip install 'fenceline-client[openai-agents]'``;
docs/openai-agents.md): every call of a function tool is a fenced operation of one Fenceline
run, whose lease ``FencedAgentRun`` holds (and renews in its thread) while the Runner runs.

    with FencedAgentRun(client, run_id) as fenced:
        agent = Agent(name="billing", tools=[fenced.tool(charge, action="charge",
                      resource=lambda args: f"customer:{args['customer']}", effect_class="NON_RETRYABLE")])
        result = fenced.run_sync(agent, "charge customer 881 five dollars")
        for item in result.interruptions:
            fenced.approval_id(item)          # the Fenceline approval a person decides
        saved = result.to_state().to_string()

    with FencedAgentRun(client, run_id) as fenced:      # later, in any process
        agent = ...                                      # the same agent, with fenced.tool(...)
        state = fenced.restore_sync(agent, saved)       # Fenceline's decisions applied
        result = fenced.run_sync(agent, state)

``needs_approval`` of a fenced tool asks Fenceline: a call whose authorization answers 202
APPROVAL_REQUIRED becomes the SDK's interruption, ``approval_id(item)`` names the approval,
and only Fenceline's decision approves or rejects the item (``decide``/``restore``); approving
an item in the SDK alone never calls the tool. Calls are numbered by their history
(``fencing.Ordinals``), so a run resumed from a RunState, or re-run, replays its operations
instead of repeating them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterable
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper, RunHooks, Runner, RunResult, RunState, function_tool
from agents.exceptions import AgentsException
from agents.items import ModelResponse, ToolApprovalItem
from agents.tool_context import ToolContext

from fenceline_client.adapters import fencing
from fenceline_client.client import ApprovalDenied, Client, Denied, Done, Effect, Lease

__all__ = ["ApprovalPending", "EffectUncertain", "FencedAgentRun", "Reported"]

Reported = fencing.Reported


class ApprovalPending(fencing.ApprovalPending, AgentsException):
    """A fenced tool was invoked while its approval still waits (approved in the SDK alone,
    say): the Runner raises it as is, and the tool did not run."""


class EffectUncertain(fencing.EffectUncertain, AgentsException):
    """An earlier attempt of the call ended UNKNOWN: the Runner stops until a person
    reconciles the operation."""


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {"_unparsed": raw}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def function_calls(items: Iterable[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(call id, tool, arguments) of the function calls among SDK items, in order."""
    return [
        (str(_field(item, "call_id")), str(_field(item, "name")), _arguments(_field(item, "arguments")))
        for item in items
        if _field(item, "type") == "function_call" and _field(item, "call_id")
    ]


def history_calls(state_string: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The function calls a serialized RunState holds, in the order the model made them: the
    original input's, the run's generated items', then each model response's (a call listed
    twice counts once: ``fencing.Ordinals`` skips known call ids)."""
    saved = json.loads(state_string)
    original = saved.get("original_input")
    items: list[Any] = list(original) if isinstance(original, list) else []
    items.extend(item.get("raw_item") or {} for item in saved.get("generated_items") or [])
    for response in saved.get("model_responses") or []:
        items.extend(response.get("output") or [])
    return function_calls(items)


class _Numbering(RunHooks[Any]):
    """Run hooks that number each function call as the model makes it (``fencing.Ordinals``)."""

    def __init__(self, ordinals: fencing.Ordinals, calls: dict[str, tuple[str, dict[str, Any]]]) -> None:
        self.ordinals, self.calls = ordinals, calls

    def observe(self, found: list[tuple[str, str, dict[str, Any]]]) -> None:
        self.ordinals.observe(found)
        for call_id, tool, args in found:
            self.calls.setdefault(call_id, (tool, args))

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, input_items: Any) -> None:
        self.observe(function_calls(input_items))

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        self.observe(function_calls(response.output))


class FencedAgentRun:
    """One Fenceline run for an agent run: a context manager holding the run's lease (renewed
    in the client's thread), the factory of its fenced tools and the way to run, pause and
    resume the agent. Build the agent's fenced tools inside it: they act under its lease."""

    def __init__(self, client: Client, run_id: str, *, ttl_s: int = 30, owner_id: str | None = None) -> None:
        self.client, self.run_id = client, run_id
        self.lease: Lease = client.lease(run_id, ttl_s=ttl_s, owner_id=owner_id)
        self.ordinals = fencing.Ordinals()
        self._calls: dict[str, tuple[str, dict[str, Any]]] = {}  # call id -> (tool, arguments)
        self._specs: dict[str, fencing.FencedTool] = {}  # tool name -> how its calls are fenced
        self._effects: dict[str, Effect] = {}  # call id -> where its operation stands
        self.hooks = _Numbering(self.ordinals, self._calls)

    def __enter__(self) -> FencedAgentRun:
        self.lease.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lease.__exit__(*exc)

    # -- tools --

    def tool(
        self,
        function: Callable[..., Any] | FunctionTool,
        *,
        action: str,
        resource: str | Callable[[dict[str, Any]], str],
        effect_class: str | None = None,
        name: str | None = None,
        **intent: Any,
    ) -> FunctionTool:
        """A function tool whose every call is a fenced operation (``action`` on ``resource``,
        text or a function of the call's arguments). ``function`` is a plain function (its
        schema from its signature, as ``@function_tool`` builds it; an exception it raises is
        reported UNKNOWN and stops the run) or a ``FunctionTool``. It may return
        ``Reported(output, Done(...))`` to report the provider's request id or cost."""
        base = (
            function
            if isinstance(function, FunctionTool)
            else function_tool(function, name_override=name, failure_error_function=None)
        )
        tool_name = name or base.name
        self._specs[tool_name] = fencing.FencedTool(action, resource, effect_class, dict(intent))

        async def invoke(context: ToolContext[Any], raw: str) -> Any:
            return await self._invoke(tool_name, base, context, raw)

        async def needs_approval(context: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
            return await self._needs_approval(tool_name, call_id)

        return FunctionTool(
            name=tool_name,
            description=base.description,
            params_json_schema=base.params_json_schema,
            on_invoke_tool=invoke,
            strict_json_schema=base.strict_json_schema,
            needs_approval=needs_approval,
        )

    def _call(self, tool: str, call_id: str) -> tuple[dict[str, Any], int, str]:
        ordinal = self.ordinals.of(call_id)
        if ordinal is None:
            raise RuntimeError(
                f"call {call_id} of {tool} was not seen in the agent's history: run the agent with "
                "FencedAgentRun.run/run_sync, resume it with restore/restore_sync"
            )
        args = self._calls[call_id][1]
        return args, ordinal, fencing.idempotency_key(self.run_id, tool, args, ordinal)

    async def _start(self, tool: str, call_id: str) -> Effect:
        args, ordinal, _ = self._call(tool, call_id)
        spec = self._specs[tool]
        effect = await asyncio.to_thread(fencing.start, self.lease, tool=tool, args=args, ordinal=ordinal, spec=spec)
        self._effects[call_id] = effect
        return effect

    async def _needs_approval(self, tool: str, call_id: str) -> bool:
        """Ask Fenceline now: 202 APPROVAL_REQUIRED is the SDK's interruption; anything
        else goes on to the tool, which acts on (or reports) the answer."""
        try:
            effect = await self._start(tool, call_id)
        except (Denied, ApprovalDenied):
            return False  # the tool reports the refusal to the model
        return effect.phase == "PENDING_APPROVAL"

    async def _invoke(self, tool: str, base: FunctionTool, context: ToolContext[Any], raw: str) -> Any:
        call_id = context.tool_call_id
        _, _, key = self._call(tool, call_id)
        try:
            effect = self._effects.get(call_id)
            if effect is None or effect.phase != "DISPATCHED":
                effect = await self._start(tool, call_id)
            if not fencing.perform_now(effect, tool=tool, key=key):
                return await asyncio.to_thread(fencing.replayed, self.lease, effect)
        except (Denied, ApprovalDenied) as refused:
            return f"Fenceline refused this call: {refused}"
        except fencing.ApprovalPending as pending:
            raise ApprovalPending(
                approval_id=pending.approval_id, operation_id=pending.operation_id, tool=tool, idempotency_key=key
            ) from None
        except fencing.EffectUncertain as uncertain:
            raise EffectUncertain(operation_id=uncertain.operation_id, tool=tool) from None
        self._effects.pop(call_id, None)
        try:
            returned = base.on_invoke_tool(context, raw)
            if inspect.isawaitable(returned):
                returned = await returned
        except BaseException:
            await asyncio.to_thread(self.lease.effect_outcome, effect.operation_id, Done(outcome="UNKNOWN"))
            raise
        return await asyncio.to_thread(fencing.report, self.lease, effect, tool=tool, returned=returned)

    # -- running, pausing, resuming --

    async def run(self, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        """``Runner.run`` with the hooks that number the calls."""
        return await Runner.run(agent, input, hooks=self.hooks, **kwargs)

    def run_sync(self, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        return asyncio.run(self.run(agent, input, **kwargs))

    def approval_id(self, item: ToolApprovalItem) -> str | None:
        """The Fenceline approval an interruption waits for (None once nothing waits)."""
        effect = self._effects.get(str(_field(item.raw_item, "call_id")))
        return effect.approval_id if effect is not None and effect.phase == "PENDING_APPROVAL" else None

    async def restore(self, agent: Agent[Any], state_string: str) -> RunState[Any, Agent[Any]]:
        """A RunState from ``RunState.to_string()``, its calls numbered as first made and its
        interruptions decided as Fenceline has them (``decide``)."""
        self.hooks.observe(history_calls(state_string))
        state = await RunState.from_string(agent, state_string)
        await self.decide(state)
        return state

    def restore_sync(self, agent: Agent[Any], state_string: str) -> RunState[Any, Agent[Any]]:
        return asyncio.run(self.restore(agent, state_string))

    async def decide(self, state: RunState[Any, Agent[Any]]) -> dict[str, str]:
        """Apply Fenceline's decisions to the state's interruptions: approved (and so
        dispatched, or decided by an earlier attempt) -> ``state.approve``; denied or refused ->
        ``state.reject``. Returns {call id: approval id} of those a person has yet to decide
        under this lease (an approval asked under an earlier lease is void: it is asked again)."""
        waiting: dict[str, str] = {}
        for item in state.get_interruptions():
            call_id = str(_field(item.raw_item, "call_id"))
            tool = item.tool_name or ""
            if tool not in self._specs:
                continue  # not a fenced tool: the SDK's own approval decides it
            try:
                effect = await self._start(tool, call_id)
            except (Denied, ApprovalDenied) as refused:
                state.reject(item, rejection_message=f"Fenceline refused this call: {refused}")
                continue
            if effect.phase == "PENDING_APPROVAL" and effect.approval_id is not None:
                waiting[call_id] = effect.approval_id
            elif effect.phase == "DENIED":
                state.reject(item, rejection_message="Fenceline: a person denied this call")
            else:
                state.approve(item)
        return waiting

    async def wait(
        self, state: RunState[Any, Agent[Any]], *, timeout_s: float = 600, poll_s: float = 2.0
    ) -> RunState[Any, Agent[Any]]:
        """``decide`` until no interruption waits for a person (the lease renews meanwhile);
        ApprovalDenied on the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await self.decide(state):
            if loop.time() >= deadline:
                raise ApprovalDenied(408, {"error": "APPROVAL_DENIED", "detail": "no decision before the timeout"})
            await asyncio.sleep(poll_s)
        return state

    def wait_sync(
        self, state: RunState[Any, Agent[Any]], *, timeout_s: float = 600, poll_s: float = 2.0
    ) -> RunState[Any, Agent[Any]]:
        return asyncio.run(self.wait(state, timeout_s=timeout_s, poll_s=poll_s))
