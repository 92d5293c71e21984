"""One MCP session of the gateway: one Fenceline run, its lease, its upstream connections, and
every ``tools/call`` as a fenced operation.

A call: the idempotency key (a digest of the run id, the tool, the canonical JSON of the
arguments and the call's ordinal among identical calls of the session), the intent with the
tool, the action and resource the gateway's contract reads from the arguments and the
arguments' digest (``Lease.effect_start``: intent, authorize, dispatch), a wait for a person
when the server answers APPROVAL_REQUIRED, then the upstream call, then the outcome
(``Lease.effect_outcome``): CONFIRMED with the result's digest, FAILED when the upstream
answers ``isError``, UNKNOWN when the call times out or its connection drops after dispatch.

The ordinal advances once an identical call was decided (CONFIRMED, FAILED, or refused by an
authority check or a person: DENY_*, APPROVAL_DENIED): a call the host repeats after a timeout,
a dropped connection, an UNKNOWN or a refusal that decided nothing (STALE_TOKEN, EFFECTS_HELD,
...) replays the same operation (the server answers its phase and the upstream is not called
again); an identical call while one is in flight waits for that one and gets its result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import mcp_types as types

from fenceline_client.client import (
    ApprovalDenied,
    Client,
    Denied,
    Done,
    Effect,
    FencelineError,
    InvalidRequest,
    Lease,
    LeaseHeld,
    TransportError,
)
from fenceline_client.gateway.boundary import Redaction, find_secret, redact_text, redact_value
from fenceline_client.gateway.config import SEPARATOR, Config, ToolContract
from fenceline_client.gateway.upstream import Held, Link, UpstreamGone, close_all

log = logging.getLogger("fenceline_client.gateway")
T = TypeVar("T")
SESSION_EVENT = "x.mcp.session"
REDACTED_EVENT = "x.mcp.redacted"
APPROVAL_POLL_S = 1.0
# The refusals of a credential lease at authorize: the upstream holding its secret is stopped.
CREDENTIAL_REFUSALS = frozenset({"DENY_REVOKED", "DENY_EXPIRED", "DENY_STALE_VERSION"})


class Refusal(Exception):
    """A call that is answered with ``isError`` and one line ``CODE: reason``."""

    def __init__(self, code: str, reason: str) -> None:
        self.code, self.reason = code, reason
        super().__init__(f"{code}: {reason}")


def refusal_of(error: BaseException) -> Refusal:
    """The one line of a refusal of the API (or of no answer from it)."""
    if isinstance(error, Refusal):
        return error
    if isinstance(error, Denied):
        budget = error.body.get("budget")
        return Refusal(error.decision, error.detail + (f" (budget {budget})" if budget else ""))
    if isinstance(error, FencelineError):
        return Refusal(str(error.body.get("error") or error.code), error.detail or error.code.lower())
    if isinstance(error, TransportError):
        return Refusal("FENCELINE_UNREACHABLE", "no answer from Fenceline; nothing was sent upstream")
    return Refusal("GATEWAY_ERROR", type(error).__name__)


def text_result(line: str, *, error: bool) -> types.CallToolResult:
    """A result of one line (a detail with a line break is folded into it)."""
    line = " ".join(line.split())
    return types.CallToolResult(content=[types.TextContent(type="text", text=line)], is_error=error)


def canonical(arguments: dict[str, Any] | None) -> str:
    return json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def worst_case_class(tool: types.Tool | None) -> str:
    """The class sent when the tenant has no contract for the tool: the upstream's annotations
    are untrusted hints (the MCP specification: never decide on them for a server that is not
    trusted), read worst-case. Only a read-only hint lowers the class, and only to IDEMPOTENT
    (a repeat is harmless), never to PURE; anything else is NON_RETRYABLE."""
    hints = tool.annotations if tool is not None else None
    if hints is not None and hints.read_only_hint is True:
        return "IDEMPOTENT"
    return "NON_RETRYABLE"


def resolve_secret(ref: str) -> str:
    """The secret a credential lease's ``credential_ref`` names, read on the gateway's host: the
    API lends a reference, never the secret. ``env:NAME`` (the gateway's environment) and
    ``file:PATH`` are read here; any other scheme (``vault:...``) is refused."""
    scheme, _, where = ref.partition(":")
    if scheme == "env" and os.environ.get(where):
        return os.environ[where]
    if scheme == "file" and where:
        try:
            return Path(where).read_text().strip()
        except OSError as failure:
            raise Refusal("CREDENTIAL_UNRESOLVED", f"the secret file of {ref} cannot be read") from failure
    raise Refusal("CREDENTIAL_UNRESOLVED", f"the gateway reads env: and file: references, not {scheme}:")


@dataclass
class Flight:
    """A call in flight, for an identical call the host sends meanwhile to wait on."""

    done: anyio.Event = field(default_factory=anyio.Event)
    answer: types.CallToolResult = field(
        default_factory=lambda: text_result("IN_FLIGHT: the same call ended without an answer", error=True)
    )


@dataclass
class Call:
    """One tools/call as the gateway reads it."""

    name: str
    link: Link
    tool: str
    arguments: dict[str, Any] | None
    contract: ToolContract
    action: str
    resource: str
    args_digest: str
    key: str


class GatewaySession:
    """One MCP session: ``open`` binds the run and holds its lease, ``call`` fences one tool call,
    ``close`` releases. Sync client calls run in worker threads; upstream calls on the loop."""

    def __init__(self, config: Config, group: anyio.abc.TaskGroup, *, session_id: str | None = None) -> None:
        self.config, self.group = config, group
        self.session_id = session_id or uuid.uuid4().hex
        self.client = Client(config.url, config.token)
        self.links = [Link(upstream) for upstream in config.upstreams]
        self.lease: Lease | None = None
        self.run_id = ""
        self.failure: Refusal | None = None
        self.opened = anyio.Event()
        self._concluded: Counter[tuple[str, str]] = Counter()
        self._inflight: dict[tuple[str, str], Flight] = {}
        self._budgets: set[tuple[str, str, str]] = set()

    def _held(self) -> Lease:
        if self.lease is None:
            raise Refusal("LEASE_LOST", "the gateway holds no lease of the session's run")
        return self.lease

    async def _sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

    # -- the session's life --

    async def open(self, *, client_name: str, client_version: str, protocol_version: str) -> None:
        """Start the upstreams, create (or join) the run, take its lease, record the session.
        A failure is kept and answers every call (``failure``); the session stays up."""
        try:
            for link in self.links:
                await link.start(self.group)
            external_id = self.config.external_id or f"mcp:{self.session_id}"
            self.run_id = self.config.run_id or str(await self._sync(self.client.create_run, external_id=external_id))
            self.lease = await self._acquire()
            fields = {
                "session_id": self.session_id,
                "client_name": client_name,
                "client_version": client_version,
                "protocol_version": protocol_version,
                "upstreams": [link.name for link in self.links],
            }
            await self._sync(self.lease.event, SESSION_EVENT, fields)
        except Exception as error:  # a refusal or an upstream that did not start: said on every call
            self.failure = (
                refusal_of(error) if not isinstance(error, UpstreamGone) else Refusal("UPSTREAM_GONE", str(error))
            )
            log.warning("session %s not opened: %s", self.session_id, self.failure)
        finally:
            self.opened.set()

    async def _acquire(self) -> Lease:
        """The run's lease. Held by someone else (a gateway of the same run that died without
        releasing it, say): tried again every second until one lease time has passed, then
        LEASE_HELD stands."""
        deadline = time.monotonic() + self.config.ttl_s + 5
        while True:
            lease = self.client.lease(self.run_id, ttl_s=self.config.ttl_s, owner_id=f"mcp-{self.session_id[:40]}")
            try:
                return await self._sync(lease.__enter__)
            except LeaseHeld:
                if time.monotonic() >= deadline:
                    raise
                await anyio.sleep(1)

    async def close(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            try:
                await self._sync(lease.__exit__, None, None, None)
            except Exception as error:  # the server is gone: the lease expires on its own
                log.warning("lease of run %s not released: %s", self.run_id, type(error).__name__)
        await close_all(self.links)

    # -- tools --

    def tools(self) -> list[types.Tool]:
        """The upstreams' tools, named as the host sees them: unchanged with one upstream,
        ``<upstream>__<tool>`` with several."""
        if len(self.links) == 1:
            return list(self.links[0].tools)
        return [
            tool.model_copy(update={"name": f"{link.name}{SEPARATOR}{tool.name}"})
            for link in self.links
            for tool in link.tools
        ]

    def _route(self, name: str) -> tuple[Link, types.Tool]:
        for link in self.links:
            prefix = "" if len(self.links) == 1 else f"{link.name}{SEPARATOR}"
            for tool in link.tools:
                if prefix + tool.name == name:
                    return link, tool
        raise Refusal("UNKNOWN_TOOL", f"no upstream has a tool named {name!r}")

    def _read(self, name: str, arguments: dict[str, Any] | None) -> tuple[Call, types.Tool]:
        link, tool = self._route(name)
        contract = self.config.contract(name)
        args = arguments or {}
        action = str(args.get(contract.action_from, "")) if contract.action_from else contract.action
        resource = str(args.get(contract.resource_from, "")) if contract.resource_from else contract.resource
        text = canonical(arguments)
        ordinal = self._concluded[(name, text)]
        key = "mcp-" + hashlib.sha256(f"{self.run_id}\n{name}\n{text}\n{ordinal}".encode()).hexdigest()
        call = Call(
            name=name,
            link=link,
            tool=tool.name,
            arguments=arguments,
            contract=contract,
            action=action or name,
            resource=(contract.resource_prefix + resource) if resource else link.name,
            args_digest=digest(text),
            key=key,
        )
        return call, tool

    async def call(self, name: str, arguments: dict[str, Any] | None, progress: Any) -> types.CallToolResult:
        """One tools/call: never raises, never hangs past the configured waits."""
        await self.opened.wait()
        same = (name, canonical(arguments))
        flight = self._inflight.get(same)
        if flight is not None:  # the host repeated a call still in flight: that call's answer
            await flight.done.wait()
            return flight.answer
        flight = self._inflight[same] = Flight()
        try:
            answer = await self._fenced(name, arguments, progress)
        except Refusal as refused:
            if refused.code.startswith("DENY_") or refused.code == "APPROVAL_DENIED":
                self._concluded[same] += 1  # decided: the same call again is a new operation
            answer = text_result(str(refused), error=True)
        except Exception as error:  # nothing may end the session: one line to the host
            log.exception("tools/call %s", name)
            answer = text_result(str(refusal_of(error)), error=True)
        except BaseException:  # cancelled by the host: a repeat waiting on it gets one line
            flight.answer = text_result("CANCELLED: the same call was cancelled by the host", error=True)
            raise
        finally:
            del self._inflight[same]
            flight.done.set()
        flight.answer = answer
        return answer

    async def _fenced(self, name: str, arguments: dict[str, Any] | None, progress: Any) -> types.CallToolResult:
        if self.failure is not None:
            raise self.failure
        call, tool = self._read(name, arguments)
        secret = find_secret(arguments or {})
        if secret is not None:
            where, kind = secret
            raise Refusal("FORBIDDEN_FIELD", f"{where} looks like a credential ({kind}); nothing was sent")
        credential_lease_id = await self._credential(call)
        if call.link.session is None:
            raise Refusal("UPSTREAM_GONE", f"upstream {call.link.name} is not connected; nothing was sent")
        await self._budget(call)
        try:
            effect = await self._start(call, tool, credential_lease_id)
        except Refusal as refused:
            if credential_lease_id and refused.code in CREDENTIAL_REFUSALS:
                await self._forget_secret(call)
            raise
        if effect.approval_id is not None:
            effect = await self._await_approval(call, effect, progress)
        if effect.phase != "DISPATCHED":
            return self._replayed(call, effect, structured=tool.output_schema is not None)
        if not effect.dispatched:  # an earlier attempt (a gateway that died) dispatched it: never again
            return await self._abandoned(call, effect)
        return await self._perform(call, effect)

    async def _abandoned(self, call: Call, effect: Effect) -> types.CallToolResult:
        """A call an earlier attempt dispatched and left without an outcome (its gateway died
        mid-call): whether the upstream acted is not known, so it is not called again; the
        operation becomes UNKNOWN, with a case for a provider lookup or a person."""
        await self._report(effect, Done(outcome="UNKNOWN"))
        line = (
            f"OUTCOME_UNKNOWN: an earlier attempt dispatched {call.name} and reported no outcome; it was not "
            f"repeated. Operation {effect.operation_id} is UNKNOWN and awaits reconciliation."
        )
        return text_result(line, error=True)

    async def _start(self, call: Call, tool: types.Tool, credential_lease_id: str | None) -> Effect:
        """Intend, authorize, dispatch. The class is the tenant's contract's; only where the
        tenant has none and takes the worker's word (422 naming ``effect_class``) is the worst
        case of the upstream's hints sent. The provider is the upstream's name unless the
        tenant's contract names another (422 naming ``provider``: sent without, the contract's
        stands). A 422 writes nothing, so sending again under the same key is one intent."""
        start = partial(
            self._held().effect_start,
            tool=call.name,
            action=call.action,
            resource=call.resource,
            idempotency_key=call.key,
            args_digest=call.args_digest,
            credential_lease_id=credential_lease_id,
        )
        terms: dict[str, Any] = {"provider": call.link.name}
        while True:
            try:
                return await self._sync(start, **terms)
            except InvalidRequest as refused:
                fields = [f.get("field") for f in refused.body.get("fields") or [] if isinstance(f, dict)]
                if fields == ["effect_class"] and "effect_class" not in terms:
                    terms["effect_class"] = worst_case_class(tool)
                elif fields == ["provider"] and "provider" in terms:
                    del terms["provider"]
                else:
                    raise refusal_of(refused) from refused
            except FencelineError as refused:
                raise refusal_of(refused) from refused

    async def _await_approval(self, call: Call, effect: Effect, progress: Any) -> Effect:
        wait_s = call.contract.approval_wait_s or self.config.approval_wait_s

        def on_wait(elapsed_s: float) -> None:
            message = f"waiting for a person to approve {call.name} (approval {effect.approval_id})"
            anyio.from_thread.run(progress, min(elapsed_s, wait_s), wait_s, message)

        try:
            return await self._sync(
                self._held().effect_await_approval, effect, timeout_s=wait_s, poll_s=APPROVAL_POLL_S, on_wait=on_wait
            )
        except ApprovalDenied as denied:
            raise Refusal("APPROVAL_DENIED", f"{denied.detail}; {call.name} was not called") from denied
        except FencelineError as refused:
            raise refusal_of(refused) from refused

    def _replayed(self, call: Call, effect: Effect, *, structured: bool) -> types.CallToolResult:
        """An earlier attempt under the same key decided this call: the upstream is not called
        again, and the gateway keeps no result to give back. Not an error when it was
        CONFIRMED, unless the tool declares an output schema: a success without its structured
        content would be an invalid result, so that one line is sent as an error."""
        same = (call.name, canonical(call.arguments))
        if effect.phase in ("CONFIRMED", "FAILED", "DENIED"):
            self._concluded[same] += 1
        line = (
            f"ALREADY_{effect.phase}: operation {effect.operation_id} of this call was {effect.phase} by an "
            "earlier attempt; it was not repeated and its result is not kept"
        )
        return text_result(line, error=structured or effect.phase != "CONFIRMED")

    async def _perform(self, call: Call, effect: Effect) -> types.CallToolResult:
        try:
            result = await call.link.call(call.tool, call.arguments, self.config.call_timeout_s)
        except Exception as error:  # timed out, or the connection dropped after dispatch
            timed_out = isinstance(error, TimeoutError) or getattr(error, "code", None) == types.REQUEST_TIMEOUT
            if not timed_out:
                call.link.session = None  # gone: later calls are refused before any intent
            await self._report(effect, Done(outcome="UNKNOWN"))
            line = (
                f"OUTCOME_UNKNOWN: {call.name} was dispatched and the upstream gave no answer "
                f"({type(error).__name__}); operation {effect.operation_id} is UNKNOWN and awaits reconciliation. "
                "It will not be retried."
            )
            return text_result(line, error=True)
        redaction = Redaction()
        shown = self._redacted(result, redaction)
        outcome = "FAILED" if result.is_error else "CONFIRMED"
        wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        await self._report(effect, Done(outcome=outcome, provider_request_id=digest(canonical(wire))))
        self._concluded[(call.name, canonical(call.arguments))] += 1
        if redaction.count:
            fields = {
                "tool": call.name,
                "operation_id": effect.operation_id,
                "kinds": sorted(redaction.kinds),
                "count": redaction.count,
            }
            await self._sync(self._held().event, REDACTED_EVENT, fields)
        return shown

    async def _report(self, effect: Effect, done: Done) -> None:
        try:
            await self._sync(self._held().effect_outcome, effect.operation_id, done)
        except Exception as error:  # the effect happened (or may have): the host still hears of it
            log.warning("outcome of %s not recorded: %s", effect.operation_id, refusal_of(error))

    @staticmethod
    def _redacted(result: types.CallToolResult, redaction: Redaction) -> types.CallToolResult:
        content: list[Any] = []
        for block in result.content:
            if isinstance(block, types.TextContent):
                block = block.model_copy(update={"text": redact_text(block.text, redaction)})
            content.append(block)
        update: dict[str, Any] = {"content": content}
        if result.structured_content is not None:
            update["structured_content"] = redact_value(result.structured_content, redaction)
        return result.model_copy(update=update)

    # -- credentials and budgets --

    async def _credential(self, call: Call) -> str | None:
        """The credential lease this call is authorized under. An upstream holding a secret is
        bound to the one lease it was started with: a call of the same action and resource
        while that lease lasts names it again (so a revoked lease is refused at authorize, and
        that upstream session ends: ``_forget_secret``); any other call takes a new lease
        scoped to itself, and the upstream is started again with the secret it lends."""
        credential = call.link.upstream.credential
        if not call.contract.credential or credential is None:
            return None
        held = call.link.held
        same_scope = held is not None and (held.action, held.resource) == (call.action, call.resource)
        if held is not None and same_scope and time.monotonic() < held.until and call.link.session is not None:
            return held.lease_id
        body = {
            "principal": credential.principal,
            "actions": [call.action],
            "resources": [call.resource],
            "ttl_s": credential.ttl_s,
        }
        try:
            lent = await self._sync(self._held().post, f"/runs/{self.run_id}/credential-leases", body)
        except FencelineError as refused:
            await self._forget_secret(call)
            raise refusal_of(refused) from refused
        secret = resolve_secret(str(lent["credential_ref"]))
        until = time.monotonic() + max(credential.ttl_s - 1, 1)
        await call.link.stop()
        await call.link.start(
            self.group, secret=secret, held=Held(str(lent["lease_id"]), call.action, call.resource, until)
        )
        return str(lent["lease_id"])

    async def _budget(self, call: Call) -> None:
        """The capability budget the gateway's contract asks for, once per action and resource."""
        budget = call.contract.budget
        scope = (call.name, call.action, call.resource)
        if budget is None or scope in self._budgets:
            return
        body: dict[str, Any] = {
            "tool": call.name,
            "actions": [call.action],
            "resources": [call.resource],
            "max_calls": budget.max_calls,
            "ttl_s": budget.ttl_s,
        }
        if budget.max_bytes is not None:
            body["max_bytes"] = budget.max_bytes
        try:
            await self._sync(self._held().post, f"/runs/{self.run_id}/capabilities", body)
        except FencelineError as refused:
            raise refusal_of(refused) from refused
        self._budgets.add(scope)

    async def _forget_secret(self, call: Call) -> None:
        """A refused credential ends the upstream session that holds its secret; the next call
        with a lease granted starts it again."""
        if call.link.held is not None:
            await call.link.stop()
            call.link.held = None
