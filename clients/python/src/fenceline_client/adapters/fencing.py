"""What the framework adapters share: how a tool call becomes a fenced operation of the run.

A call is named by its idempotency key ``<run_id>:<tool>:<args digest>#<ordinal>``: the tool,
the SHA-256 of its canonical arguments (JSON, sorted keys, no spaces) and its ordinal, the
number of earlier calls of the same tool with the same arguments in the agent's history. A
resumed run, or a re-run that makes the same calls in the same order, names the same
operations, so Fenceline replays them instead of repeating them: the tool's function is called
only for an operation this lease has just dispatched. Its output is kept as the payload of an
``x.tool_result`` event (best effort: within 64 KB and through the secret boundary), and a
replay of a CONFIRMED call returns it without calling the function again.

No framework is imported here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fenceline_client.client import (
    ApprovalDenied,
    Done,
    Effect,
    ForbiddenField,
    InvalidRequest,
    Lease,
    PayloadTooLarge,
    UserContentRefused,
)

RESULT_EVENT = "x.tool_result"
MAX_TOOL_IN_KEY = 60  # the key stays under the server's 200 characters with any run id and ordinal


class ApprovalPending(Exception):
    """The call waits for a person: Fenceline answered 202 APPROVAL_REQUIRED. The framework's
    pause (an SDK interruption, a LangGraph interrupt) carries ``approval_id``."""

    def __init__(self, *, approval_id: str, operation_id: str, tool: str, idempotency_key: str) -> None:
        self.approval_id, self.operation_id, self.tool, self.idempotency_key = (
            approval_id,
            operation_id,
            tool,
            idempotency_key,
        )
        super().__init__(f"{tool}: approval {approval_id} pending for operation {operation_id}")


class EffectUncertain(Exception):
    """An earlier attempt of this call ended UNKNOWN (its lease was lost after dispatch):
    nobody knows whether the effect happened, so the agent stops until a person reconciles
    the operation in the console. Not retried, not reported as done."""

    def __init__(self, *, operation_id: str, tool: str) -> None:
        self.operation_id, self.tool = operation_id, tool
        super().__init__(f"{tool}: operation {operation_id} is UNKNOWN; reconcile it in the console first")


@dataclass(frozen=True)
class FencedTool:
    """How one tool's calls become operations: the ``action``, the ``resource`` (text, or a
    function of the call's arguments), the side-effect class (left out where the tenant's
    tool contract gives it) and further intent fields (``provider``, ``estimated_cost_cents``)."""

    action: str
    resource: str | Callable[[dict[str, Any]], str]
    effect_class: str | None = None
    intent: dict[str, Any] = field(default_factory=dict)

    def resource_for(self, args: dict[str, Any]) -> str:
        return self.resource(args) if callable(self.resource) else self.resource


@dataclass(frozen=True)
class Reported:
    """What a tool function may return instead of its bare output, to report the provider's
    answer: ``output`` goes to the model, ``done`` to Fenceline (a provider request id, a cost,
    or ``Done(outcome="FAILED")``)."""

    output: Any
    done: Done


def canonical(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def args_digest(args: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical(args).encode("utf-8")).hexdigest()


def idempotency_key(run_id: str, tool: str, args: dict[str, Any], ordinal: int) -> str:
    return f"{run_id}:{tool[:MAX_TOOL_IN_KEY]}:{args_digest(args)[7:39]}#{ordinal}"


class Ordinals:
    """Ordinals of tool calls by call id, in the order the agent's history shows them."""

    def __init__(self) -> None:
        self._by_call: dict[str, int] = {}
        self._seen: Counter[tuple[str, str]] = Counter()

    def observe(self, calls: Iterable[tuple[str, str, dict[str, Any]]]) -> None:
        """``calls``: (call id, tool, arguments) in history order; known ids are skipped."""
        for call_id, tool, args in calls:
            if call_id in self._by_call:
                continue
            same = (tool, canonical(args))
            self._by_call[call_id] = self._seen[same]
            self._seen[same] += 1

    def of(self, call_id: str) -> int | None:
        return self._by_call.get(call_id)


def start(lease: Lease, *, tool: str, args: dict[str, Any], ordinal: int, spec: FencedTool) -> Effect:
    """Intend, authorize and dispatch the call as far as nothing waits for a person (a replay
    when an earlier attempt intended it: the phase it reached)."""
    return lease.effect_start(
        tool=tool,
        action=spec.action,
        resource=spec.resource_for(args),
        idempotency_key=idempotency_key(lease.run_id, tool, args, ordinal),
        effect_class=spec.effect_class,
        args_digest=args_digest(args),
        **spec.intent,
    )


def perform_now(effect: Effect, *, tool: str, key: str) -> bool:
    """True for an operation just DISPATCHED (call the tool now), False for one an earlier
    attempt decided (``replayed``). PENDING_APPROVAL raises ApprovalPending, UNKNOWN
    EffectUncertain, DENIED ApprovalDenied."""
    if effect.phase == "PENDING_APPROVAL" and effect.approval_id is not None:
        raise ApprovalPending(
            approval_id=effect.approval_id, operation_id=effect.operation_id, tool=tool, idempotency_key=key
        )
    if effect.phase == "UNKNOWN":
        raise EffectUncertain(operation_id=effect.operation_id, tool=tool)
    if effect.phase == "DENIED":
        raise ApprovalDenied(403, {"error": "APPROVAL_DENIED", "detail": f"operation {effect.operation_id} was denied"})
    return effect.phase == "DISPATCHED"


def report(lease: Lease, effect: Effect, *, tool: str, returned: Any) -> Any:
    """Report what the tool returned (a bare output: CONFIRMED; ``Reported``: its ``done``),
    keep the output for replays, and return it."""
    output, done = (returned.output, returned.done) if isinstance(returned, Reported) else (returned, Done())
    lease.effect_outcome(effect.operation_id, done)
    keep(lease, effect.operation_id, tool, output)
    return output


def finish(lease: Lease, effect: Effect, *, tool: str, key: str, perform: Callable[[], Any]) -> Any:
    """The output of a started call: ``perform()`` for an operation just DISPATCHED (its
    outcome reported, UNKNOWN if it raises), the kept output of one an earlier attempt
    CONFIRMED (``perform_now`` for the phases that raise)."""
    if not perform_now(effect, tool=tool, key=key):
        return replayed(lease, effect)
    try:
        returned = perform()
    except BaseException:
        lease.effect_outcome(effect.operation_id, Done(outcome="UNKNOWN"))
        raise
    return report(lease, effect, tool=tool, returned=returned)


def keep(lease: Lease, operation_id: str, tool: str, output: Any) -> None:
    """Keep the output for replays, if the boundary lets it: a refused payload only means a
    replay answers with the operation's summary instead."""
    with contextlib.suppress(ForbiddenField, PayloadTooLarge, InvalidRequest, UserContentRefused):
        lease.event(
            RESULT_EVENT,
            {"operation_id": operation_id, "tool": tool},
            payload={"output": json.loads(json.dumps(output, default=str))},
        )


def replayed(lease: Lease, effect: Effect) -> Any:
    """What a call an earlier attempt decided answers now: its kept output when CONFIRMED,
    else a summary of the operation (phase, provider request id)."""
    if effect.phase == "CONFIRMED":
        export = lease.client.get(f"/runs/{lease.run_id}/events")
        for event in reversed(export["events"]):
            fields = event.get("fields") or {}
            if event["type"] == RESULT_EVENT and fields.get("operation_id") == effect.operation_id:
                payload = event.get("payload")
                if isinstance(payload, dict) and "output" in payload:
                    return payload["output"]
    operation = lease.client.get_operation(effect.operation_id)
    summary = {"operation_id": effect.operation_id, "phase": operation["phase"], "replayed": True}
    if operation.get("provider_request_id"):
        summary["provider_request_id"] = operation["provider_request_id"]
    return json.dumps(summary)
