"""Fenceline's Python worker client: the lease renewal thread, the fenced calls and the
operation walk, so a worker does not hand-write them. No Django import: install the
``fenceline-client`` distribution (``pip install ./clients/python``; ``fenceline_client``
re-exports the names below), or copy this one file next to a worker; it needs only ``urllib3``.

    client = Client("https://fenceline.example", token)
    run_id = client.create_run(external_id="invoice-17")
    with client.lease(run_id, ttl_s=30) as lease:        # renews every ttl/3 in a thread
        resume = lease.checkpoint_state                   # the last saved progress, or None
        charged = lease.operation(
            tool="payments", action="charge", resource="customer:881",
            effect_class="NON_RETRYABLE", idempotency_key="charge:881:invoice-17",
            perform=lambda: provider.charge(...),         # returns Done(...) or raises
        )
        lease.checkpoint("charged", {"invoice": 17})
        lease.complete()

Every refusal of the API is one exception class (``ERRORS``, by the API's error code); a
renewal that fails in the background (LEASE_LOST, RUN_CANCELLED, STALE_TOKEN) is raised at
the worker's next call on the lease, in the worker's own thread. See ``docs/client.md``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import stat
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3

_otel_inject: Callable[[dict[str, str]], None] | None
try:  # the worker's own OpenTelemetry context, when it has one (pip install fenceline-client[otel])
    from opentelemetry.propagate import inject as _otel_inject
except ImportError:  # pragma: no cover - the extra is optional
    _otel_inject = None

SCHEMA_VERSION = 1  # the version of the runs this client creates
# The record versions this client reads (an operation is at 2 once the operation.provider_ref
# change migrates; docs/api.md "Versions"): a record at any other version is refused here,
# before anything acts on it. Its boot reports say it reads up to the largest.
READS_SCHEMA_VERSIONS = frozenset({1, 2})
DIRECTIVE_HEADER = "Fenceline-Directive"
KEPT_CONNECTIONS = 10  # per client, kept open between calls (requests' default pool size)
# The boot report a worker sends unless it sends its own: the client's build, no config
# named, every domain ready (the runtime one with the container self-audit).
DEFAULT_CODE_VERSION = "fenceline-client 0.1.0"
DEFAULT_CONFIG_HASH = "unnamed"
# The worker tokens whose boot this process has reported, by (pid, digest of the token): one
# process is one boot, whichever of its Client objects sends it.
_BOOTED: set[tuple[int, str]] = set()


# --- errors: one class per code --------------------------------------------------------


class FencelineError(Exception):
    """A refusal of the API: ``code`` and ``status`` as documented in docs/api.md, ``body`` as sent."""

    code = "ERROR"

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.detail = str(body.get("detail", ""))
        super().__init__(f"{body.get('error', self.code)} ({status}): {self.detail}")


class InvalidRequest(FencelineError):
    code = "VALIDATION_ERROR"


class MalformedJSON(FencelineError):
    code = "MALFORMED_JSON"


class PayloadTooLarge(FencelineError):
    code = "PAYLOAD_TOO_LARGE"


class Unauthorized(FencelineError):
    code = "UNAUTHORIZED"


class Forbidden(FencelineError):
    code = "FORBIDDEN"


class ForbiddenField(FencelineError):
    code = "FORBIDDEN_FIELD"


class NotFound(FencelineError):
    code = "NOT_FOUND"


class LeaseHeld(FencelineError):
    code = "LEASE_HELD"


class LeaseLost(FencelineError):
    """This worker no longer owns the run: stop acting on it (``body['reason']`` says why)."""

    code = "LEASE_LOST"


class StaleToken(FencelineError):
    """A write under a token that is not current: the run moved on without this worker."""

    code = "STALE_TOKEN"


class WrongPhase(FencelineError):
    code = "WRONG_PHASE"


class IdempotencyMismatch(FencelineError):
    code = "IDEMPOTENCY_MISMATCH"


class WorkerNotAccepting(FencelineError):
    code = "WORKER_NOT_ACCEPTING"


class WorkerDraining(WorkerNotAccepting):
    """This worker is draining: finish what is in flight, checkpoint, release, exit."""

    code = "WORKER_DRAINING"


class NotReady(WorkerNotAccepting):
    """The worker's last boot reported a domain not ready: no lease until a ready boot."""

    code = "NOT_READY"


class CredentialsNotReady(NotReady):
    code = "CREDENTIALS_NOT_READY"


class RunCompleted(FencelineError):
    code = "RUN_COMPLETED"


class RunCancelled(FencelineError):
    """The run is cancelled or timed out: report what is in flight, then release."""

    code = "RUN_CANCELLED"


class ReconcileFirst(FencelineError):
    code = "RECONCILE_FIRST"


class AlreadyDelivered(FencelineError):
    """A retry of a NON_RETRYABLE send the provider reports DELIVERED or DEFERRED: sending
    again would deliver it twice. ``body["delivery_state"]`` and ``body["message_id"]`` say which."""

    code = "ALREADY_DELIVERED"


class BadSignature(FencelineError):
    """A provider webhook whose signature did not verify (the webhook receiver's refusal;
    listed so that every code the server has is an exception here)."""

    code = "BAD_SIGNATURE"


class EffectClassMismatch(FencelineError):
    """The tool contract gives the operation another side-effect class than the one declared."""

    code = "EFFECT_CLASS_MISMATCH"


class BootIdReused(FencelineError):
    """The boot_id was reported already with other content: a new process needs a new id."""

    code = "BOOT_ID_REUSED"


class ResourceInUse(FencelineError):
    code = "RESOURCE_IN_USE"


class UnknownSchemaVersion(FencelineError):
    code = "UNKNOWN_SCHEMA_VERSION"


class StateConflict(FencelineError):
    """A record of the run disagrees with itself during an upgrade: nothing on this run
    proceeds until a person decides (the console's Upgrades page)."""

    code = "STATE_CONFLICT"


class UpgradeRefused(FencelineError):
    """An upgrade step whose preconditions do not hold (operators' commands; listed so that
    every code the server has is an exception here)."""

    code = "UPGRADE_REFUSED"


class EffectsHeld(FencelineError):
    """The tenant was restored from a backup: read and record, no authorize or dispatch,
    until a person allows effects."""

    code = "EFFECTS_HELD"


class UserContentRefused(FencelineError):
    """An event payload of class user_content for a tenant that has not opted in to keep it."""

    code = "USER_CONTENT_REFUSED"


class Denied(FencelineError):
    """An authority check refused: ``decision`` is the DENY_* code (``budget`` / ``quota`` name what)."""

    code = "DENY"

    @property
    def decision(self) -> str:
        return str(self.body.get("decision") or self.body.get("error", ""))


class ApprovalDenied(FencelineError):
    """A person denied the approval an operation waited for."""

    code = "APPROVAL_DENIED"


class RetryLater(FencelineError):
    """Not decided now: send the same call again after ``retry_after_s`` seconds."""

    @property
    def retry_after_s(self) -> int:
        value = self.body.get("retry_after_s")
        return value if isinstance(value, int) and value >= 0 else 1


class TooManyRequests(RetryLater):
    """Too many unknown tokens from this client's address (429): the window ends after ``retry_after_s``."""

    code = "TOO_MANY_REQUESTS"


class DatabaseUnavailable(RetryLater):
    """The server cannot reach its database (503): the call was not decided, unless the
    connection broke during its commit; read back before repeating a write that is not idempotent."""

    code = "DATABASE_UNAVAILABLE"


class RestoreUnchecked(RetryLater):
    """The server's database is a restored image whose fence has not been moved yet (503):
    nothing was decided; once ``restore_check`` has run, this lease is ended there anyway."""

    code = "RESTORE_UNCHECKED"


class Throttled(RetryLater):
    """A flow limit of the tenant's policy has no room for this dispatch now (409): its
    concurrency places are all held or its rate limit's tokens are spent. Nothing was decided:
    the operation stays AUTHORIZED; dispatch it again after ``retry_after_s``. ``key`` names
    the limit's key (``tenant``, ``tool:<name>``, ``provider:<name>``, ``key:<flow_key>``)."""

    code = "THROTTLED"

    @property
    def key(self) -> str:
        return str(self.body.get("key", ""))


class KeyUnavailable(FencelineError):
    """A kept value is sealed under a key the server no longer holds (503)."""

    code = "KEY_UNAVAILABLE"


class ServerError(FencelineError):
    code = "SERVER_ERROR"


class TransportError(OSError):
    """No answer: the connection failed, broke or timed out. The request may or may not have
    reached the server (an intent or outcome may have been written); its idempotency makes the
    same call safe to repeat. Not a refusal, so not a ``FencelineError``."""


class StopWorker(FencelineError):
    """The server told this worker to stop (``Fenceline-Directive: STOP_WORKER`` on a
    response): it is QUARANTINED, e.g. after too many writes with dead tokens. Exit without
    acting further; a person decides when it may resume. Not an error code of a body: the
    directive rides on every response, answers included."""

    code = "STOP_WORKER"


ERRORS: dict[str, type[FencelineError]] = {
    cls.code: cls
    for cls in (
        TooManyRequests,
        DatabaseUnavailable,
        RestoreUnchecked,
        Throttled,
        KeyUnavailable,
        InvalidRequest,
        MalformedJSON,
        PayloadTooLarge,
        Unauthorized,
        Forbidden,
        ForbiddenField,
        NotFound,
        LeaseHeld,
        LeaseLost,
        StaleToken,
        WrongPhase,
        IdempotencyMismatch,
        WorkerNotAccepting,
        WorkerDraining,
        NotReady,
        CredentialsNotReady,
        RunCompleted,
        RunCancelled,
        ReconcileFirst,
        AlreadyDelivered,
        BadSignature,
        BootIdReused,
        EffectClassMismatch,
        ResourceInUse,
        UnknownSchemaVersion,
        StateConflict,
        EffectsHeld,
        UpgradeRefused,
        UserContentRefused,
    )
}


def error_for(status: int, body: dict[str, Any]) -> FencelineError:
    code = str(body.get("error", ""))
    if code.startswith("DENY_"):
        return Denied(status, body)
    cls = ERRORS.get(code) or (ServerError if status >= 500 else FencelineError)
    return cls(status, body)


# --- the container self-audit (article "Your Agent Container Is Not Isolated Until You
# Test the Mounts"), run by the worker on itself and sent with its boot report ------------

# Linux capability numbers 0..40, in order (linux/capability.h).
CAPABILITIES = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
]
# Paths that give control of the host when reachable from inside: (path, what makes it so).
HOST_CONTROL = (
    ("var/run/docker.sock", "socket"),
    ("run/docker.sock", "socket"),
    ("run/containerd/containerd.sock", "socket"),
    ("root/.ssh", "dir"),
    ("proc/1/root/etc/shadow", "readable"),
)
# A mount whose source (or mount point) is one of these reaches host secrets or control.
SENSITIVE_SOURCES = ("/home", "/root", "/etc", "/var/run/docker.sock", "/run/docker.sock", "/var/lib/docker")
SENSITIVE_NAMES = (".ssh", ".aws", ".kube", ".docker", ".gnupg")
PSEUDO_FILESYSTEMS = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "devtmpfs",
    "securityfs",
    "debugfs",
    "tracefs",
    "pstore",
    "bpf",
    "hugetlbfs",
    "fusectl",
    "configfs",
    "binfmt_misc",
    "autofs",
    "nsfs",
}
MAX_LISTED = 16  # the evidence of a boot stays small (the server caps it at 4 KiB)


def _capabilities(hex_mask: str) -> list[str]:
    mask = int(hex_mask, 16)
    return [name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1]


def _host_control(root: str) -> list[str]:
    found = []
    for path, kind in HOST_CONTROL:
        full = os.path.join(root, path)
        try:
            mode = os.stat(full).st_mode
        except OSError:
            continue
        if (
            (kind == "socket" and stat.S_ISSOCK(mode))
            or (kind == "dir" and stat.S_ISDIR(mode))
            or (kind == "readable" and os.access(full, os.R_OK))
        ):
            found.append("/" + path)
    return found


def _unescaped(path: str) -> str:
    """A path as mountinfo writes it, with space, tab, newline and backslash as octal
    escapes (``\\040``), read back."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _mounts(mountinfo: str) -> tuple[list[str], list[str], bool]:
    """(sensitive mounts, writable mounts, root read-only) from /proc/self/mountinfo lines:
    ``id parent dev root mount_point options ... - fstype source super_options``. A mount
    point mounted over again counts as its last mount (the one this process sees)."""
    seen: dict[str, tuple[str, list[str], str]] = {}  # point -> (source root, options, fstype)
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 6:
            continue
        point = _unescaped(fields[4])
        seen.pop(point, None)  # mounted over: listed again in its new place, last
        seen[point] = (_unescaped(fields[3]), fields[5].split(","), line.split(" - ", 1)[1].split()[0])
    sensitive, writable = [], []
    for point, (source_root, options, fstype) in seen.items():
        if fstype in PSEUDO_FILESYSTEMS:
            continue
        if "rw" in options and point != "/":
            writable.append(point)
        reaches = any(p == s or p.startswith(s + "/") for s in SENSITIVE_SOURCES for p in (source_root, point)) or any(
            name in p.split("/") for name in SENSITIVE_NAMES for p in (source_root, point)
        )
        if reaches:
            sensitive.append(f"{source_root} -> {point}" if source_root != point else point)
    root_read_only = "/" in seen and "ro" in seen["/"][1]
    return sensitive[:MAX_LISTED], writable[:MAX_LISTED], root_read_only


def runtime_audit(*, proc: str = "/proc", root: str = "/") -> dict[str, Any]:
    """What this process can reach, checked from inside: its user id, its effective Linux
    capabilities, writable and sensitive mounts, and host-control paths such as a docker
    socket. Sent as ``readiness.runtime.evidence.audit``; a tenant policy with
    ``runtime_audit`` refuses admission to a boot that fails it. Paths only, no contents."""
    status: dict[str, str] = {}
    with contextlib.suppress(OSError), open(os.path.join(proc, "self/status")) as lines:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in lines if ":\t" in line)
    mountinfo = ""
    with contextlib.suppress(OSError), open(os.path.join(proc, "self/mountinfo")) as text:
        mountinfo = text.read()
    sensitive, writable, root_read_only = _mounts(mountinfo)
    uid = status.get("Uid", "").split()
    return {
        "uid": int(uid[1]) if len(uid) > 1 else None,  # the effective user id
        "capabilities": _capabilities(status["CapEff"]) if "CapEff" in status else None,
        "no_new_privileges": status.get("NoNewPrivs", "").strip() == "1",
        "read_only_root": root_read_only,
        "writable_mounts": writable,
        "sensitive_mounts": sensitive,
        "host_control": _host_control(root),
    }


def runtime_readiness(audit: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``runtime`` domain of a boot report: up, with the self-audit as its evidence."""
    return {"ok": True, "evidence": {"audit": audit if audit is not None else runtime_audit()}}


def default_readiness() -> dict[str, dict[str, Any]]:
    """The readiness of the boot report sent before the first lease when the worker sent none:
    the runtime domain with the self-audit, every other domain ready with no evidence."""
    others = ("state", "credentials", "outbound_delivery", "admission")
    return {"runtime": runtime_readiness(), **{domain: {"ok": True, "evidence": {}} for domain in others}}


# --- the client ------------------------------------------------------------------------


def new_traceparent() -> str:
    """A fresh W3C traceparent (a new trace, sampled): for a worker with no tracing of its own
    that still wants its calls' events and operations to share one trace id."""
    import secrets

    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def _connections(base: str) -> tuple[urllib3.PoolManager | urllib3.HTTPConnectionPool, str]:
    """Where a client's requests go and the prefix of their paths: the server's keep-alive
    pool, or the proxy that the environment names for it (HTTPS_PROXY, HTTP_PROXY, NO_PROXY),
    read once here. Every thread that calls at once gets a connection (the worker's, each
    lease's renewal thread); up to ``KEPT_CONNECTIONS`` stay open between calls."""
    parsed = urllib3.util.parse_url(base)
    proxy = urllib.request.getproxies().get(parsed.scheme or "http")
    if proxy and not urllib.request.proxy_bypass(parsed.host or ""):
        return urllib3.ProxyManager(proxy, maxsize=KEPT_CONNECTIONS), base
    return urllib3.connection_from_url(base, maxsize=KEPT_CONNECTIONS), parsed.path or ""


@dataclass(frozen=True)
class Done:
    """What ``perform`` returns when the provider answered: CONFIRMED (default) or FAILED."""

    provider_request_id: str = ""
    outcome: str = "CONFIRMED"
    actual_cost_cents: int | None = None
    error_code: str = ""
    # The provider's record as {"id": ..., "provider": ...} (provider optional: the
    # operation's own); sent beside or instead of provider_request_id.
    provider_ref: dict[str, str] | None = None
    # This attempt used one of the breaker's fallbacks (``Effect.levers``): True / False;
    # None says nothing (the tenant's fallback rate counts only what is said).
    fallback_used: bool | None = None


@dataclass(frozen=True)
class Levers:
    """What the tenant's policy hands a dispatch while its cost breaker is THROTTLED or
    DEGRADED: hold the output to ``max_output_tokens`` (None: no ceiling) and prefer
    ``fallbacks`` (e.g. cheaper model names), best first."""

    state: str
    max_output_tokens: int | None = None
    fallbacks: tuple[str, ...] = ()

    @classmethod
    def from_answer(cls, answer: object) -> Levers | None:
        """From a dispatch answer's ``levers`` (None when it carries none)."""
        if not isinstance(answer, dict):
            return None
        ceiling = answer.get("max_output_tokens")
        return cls(
            state=str(answer.get("state", "")),
            max_output_tokens=int(ceiling) if ceiling is not None else None,
            fallbacks=tuple(str(f) for f in answer.get("fallbacks") or ()),
        )


@dataclass(frozen=True)
class Effect:
    """Where ``Lease.effect_start`` left an operation: its id, its phase and, while a person
    must decide, the approval to wait for. When this call dispatched it: the cost
    reservation the dispatch made (``reservation_id``) and the breaker's ``levers`` (None
    while the breaker is NORMAL, or the policy sets none for its state)."""

    operation_id: str
    phase: str
    approval_id: str | None = None
    credential_lease_id: str | None = None
    # This call dispatched it. False for a DISPATCHED that an earlier attempt under the same key
    # left without an outcome: whether that effect happened is not known.
    dispatched: bool = False
    reservation_id: str | None = None
    levers: Levers | None = None


class Client:
    """One worker identity talking to Fenceline over HTTP (one keep-alive session)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        reads: frozenset[int] = READS_SCHEMA_VERSIONS,
        traceparent: str | None = None,
    ) -> None:
        self.base = base_url.rstrip("/") + "/api/v1"
        # Sent as W3C ``traceparent`` on every call (its trace id is kept on the operations
        # and events the call writes), unless OpenTelemetry's current span in the calling
        # thread gives one: that wins. Set or change it at any time.
        self.traceparent = traceparent
        self.timeout = timeout
        self.reads = reads  # the record versions this client acts on
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.pool, self.prefix = _connections(self.base)
        self._timeout = urllib3.Timeout(connect=timeout, read=timeout)
        self.stop_requested = False  # set once a response carries the STOP_WORKER directive
        self._boot_key = hashlib.sha256(token.encode("utf-8")).hexdigest()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """One request, never repeated here; a refusal raises its exception, no answer raises
        ``TransportError``. Returns (status, body) otherwise."""
        payload = None if body is None else json.dumps(body).encode()
        try:
            response = self.pool.urlopen(
                method,
                self.prefix + path,
                body=payload,
                headers=self._headers(),
                timeout=self._timeout,
                retries=False,  # a POST that may have landed is the caller's to repeat, by its key
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as failure:
            raise TransportError(f"{method} {path}: {type(failure).__name__}") from failure
        status = response.status
        if response.headers.get(DIRECTIVE_HEADER) == StopWorker.code:
            self.stop_requested = True
        try:
            data = json.loads(response.data)
        except ValueError:
            data = None
        if not isinstance(data, dict):  # a proxy's page, or JSON that is not the API's
            text = response.data.decode(errors="replace")[:200]
            data = {"error": "SERVER_ERROR" if status >= 500 else "", "detail": text}
        if status >= 400:
            raise error_for(status, data)
        return status, data

    def _headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        if _otel_inject is not None:
            _otel_inject(carrier)
        traceparent = carrier.get("traceparent") or self.traceparent
        return {**self.headers, "traceparent": traceparent} if traceparent else self.headers

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call("POST", path, body or {})[1]

    def get(self, path: str) -> dict[str, Any]:
        return self.call("GET", path)[1]

    def readable(self, record: dict[str, Any], what: str = "record") -> dict[str, Any]:
        """``record`` if this client reads its schema_version; else UnknownSchemaVersion,
        raised here so that nothing acts on a record it would misread."""
        version = record.get("schema_version", 1)
        if version not in self.reads:
            listed = ", ".join(str(v) for v in sorted(self.reads))
            raise UnknownSchemaVersion(
                409,
                {
                    "error": UnknownSchemaVersion.code,
                    "detail": f"{what} has schema_version {version!r}; this client reads only {listed}",
                },
            )
        return record

    def get_operation(self, operation_id: str) -> dict[str, Any]:
        """An operation as the server holds it (checked readable: ``readable``)."""
        return self.readable(self.get(f"/operations/{operation_id}"), "operation")

    def create_run(
        self, *, external_id: str | None = None, parent_run_id: str | None = None, max_runtime_s: int | None = None
    ) -> str:
        body: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for name, value in (
            ("external_id", external_id),
            ("parent_run_id", parent_run_id),
            ("max_runtime_s", max_runtime_s),
        ):
            if value is not None:
                body[name] = value
        return str(self.post("/runs", body)["run_id"])

    def lease(self, run_id: str, *, ttl_s: int = 30, owner_id: str | None = None, tool: str | None = None) -> Lease:
        return Lease(self, run_id, ttl_s=ttl_s, owner_id=owner_id or f"owner-{uuid.uuid4().hex[:12]}", tool=tool)

    def boot(
        self,
        *,
        config_hash: str,
        code_version: str,
        readiness: dict[str, dict[str, Any]],
        state_schema_version: int | None = None,
        credential_version: int | None = None,
        error: dict[str, str] | None = None,
        honour_delay: bool = True,
    ) -> dict[str, Any]:
        """Report this process's start with its readiness per domain (runtime, state,
        credentials, outbound_delivery, admission: each ``{"ok": bool, "evidence": {...}}``;
        ``runtime_readiness()`` gives the runtime domain with the container self-audit) and,
        unless told otherwise, wait the restart delay the answer gives. ``error`` is what the
        process failed with while starting, ``{"kind", "message", "at"}`` (kind one of config,
        migration, credentials, dependency, crash; a migration error quarantines the worker)."""
        body: dict[str, Any] = {
            "boot_id": uuid.uuid4().hex,
            "config_hash": config_hash,
            "code_version": code_version,
            "state_schema_version": state_schema_version if state_schema_version is not None else max(self.reads),
            "pid": os.getpid(),
            "host": socket.gethostname()[:200] or "unknown",
            "readiness": readiness,
        }
        if credential_version is not None:
            body["credential_version"] = credential_version
        if error is not None:
            body["error"] = error
        answer = self.post("/workers/me/boots", body)
        _BOOTED.add((os.getpid(), self._boot_key))
        if honour_delay and answer["delay_s"] and not answer["quarantined"]:
            time.sleep(answer["delay_s"])
        return answer

    @property
    def booted(self) -> bool:
        """Whether this process has reported its boot under this worker's token."""
        return (os.getpid(), self._boot_key) in _BOOTED

    def ensure_booted(self) -> None:
        """Send the default boot report (``default_readiness()``) unless this process has
        reported its boot already: what ``Lease`` does before acquiring, so a worker's first
        lease always follows a boot report (a tenant policy may require one)."""
        if not self.booted:
            self.boot(config_hash=DEFAULT_CONFIG_HASH, code_version=DEFAULT_CODE_VERSION, readiness=default_readiness())

    def heartbeat(self) -> dict[str, Any]:
        return self.post("/workers/me/heartbeat")

    def drain(self, *, deadline_s: int, reason: str | None = None) -> dict[str, Any]:
        """What a SIGTERM handler calls first: no new lease, intent or dispatch from now on
        (nor a boot report sent before a lease: this process is past its start)."""
        _BOOTED.add((os.getpid(), self._boot_key))
        return self.post("/workers/me/drain", {"deadline_s": deadline_s, **({"reason": reason} if reason else {})})

    def exit(self) -> dict[str, Any]:
        _BOOTED.add((os.getpid(), self._boot_key))  # past its start, as after drain()
        return self.post("/workers/me/exit")


class Lease:
    """A held run lease. Use it as a context manager: it is acquired on entry, renewed in a
    background thread every ``ttl_s / 3`` seconds, and released on exit (unless the run was
    completed). Every call carries the fencing token; a background failure is raised at the
    next call."""

    def __init__(self, client: Client, run_id: str, *, ttl_s: int, owner_id: str, tool: str | None) -> None:
        self.client, self.run_id, self.ttl_s, self.owner_id, self.tool = client, run_id, ttl_s, owner_id, tool
        self.token = 0
        self.checkpoint_state: dict[str, Any] | None = None
        self.checkpoint_position: str | None = None
        self.cancel: dict[str, Any] | None = None  # set once a renewal says the run is cancelled
        self.renewals = 0
        self._failure: FencelineError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended = False
        # The breaker's levers the last dispatch through ``operation`` handed over (None: none):
        # ``perform`` reads them to hold its output or take a fallback.
        self.levers: Levers | None = None

    # -- lifetime --

    def __enter__(self) -> Lease:
        self.client.ensure_booted()
        body: dict[str, Any] = {"owner_id": self.owner_id, "ttl_s": self.ttl_s}
        if self.tool:
            body["tool"] = self.tool
        granted = self.client.post(f"/runs/{self.run_id}/lease", body)
        self.token = int(granted["fencing_token"])
        checkpoint = granted.get("checkpoint")
        if checkpoint:
            self.checkpoint_state, self.checkpoint_position = checkpoint["state"], checkpoint["position"]
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.run_id[:8]}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout + 1)
        if not self._ended and self._failure is None:
            with contextlib.suppress(LeaseLost, StaleToken, RunCancelled):  # it ended on its own meanwhile
                self.release()

    def _renew_loop(self) -> None:
        interval = max(self.ttl_s / 3, 0.2)
        while not self._stop.wait(interval):
            try:
                renewed = self.client.post(
                    f"/runs/{self.run_id}/lease/renew",
                    {"owner_id": self.owner_id, "fencing_token": self.token, "ttl_s": self.ttl_s},
                )
            except (TransportError, ServerError, RetryLater):
                continue  # a passing outage: the lease may still be valid; try again next tick
            except FencelineError as failure:  # LEASE_LOST, STALE_TOKEN, RUN_CANCELLED, a revoked token ...
                self._failure = failure  # raised at the worker's next call
                return
            self.renewals += 1
            self.cancel = renewed.get("cancel") or self.cancel
            if self.client.stop_requested:
                return  # raised at the worker's next call

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self.client.stop_requested:
            self._failure = StopWorker(409, {"error": StopWorker.code, "detail": "the server told this worker to stop"})
            raise self._failure

    @property
    def alive(self) -> bool:
        return self._failure is None and not self._ended and not self.client.stop_requested

    # -- fenced calls --

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A fenced call: the token is added; a background failure is raised first."""
        self._check()
        try:
            return self.client.post(path, {"fencing_token": self.token, **(body or {})})
        except (LeaseLost, StaleToken, RunCancelled) as failure:
            self._failure = self._failure or failure
            raise

    def checkpoint(self, position: str, state: dict[str, Any]) -> dict[str, Any]:
        saved = self.post(f"/runs/{self.run_id}/checkpoints", {"position": position, "state": state})
        self.checkpoint_state, self.checkpoint_position = state, position
        return saved

    def event(
        self,
        type: str,
        fields: dict[str, Any],
        *,
        payload: dict[str, Any] | None = None,
        payload_class: str = "event_payload",
    ) -> dict[str, Any]:
        """Append an event: ``fields`` go into the chain for good; ``payload``, if given, into
        the diagnostic plane for the tenant's retention (``payload_class`` "user_content" only
        for a tenant that opted in), the chain committing to its digest."""
        body: dict[str, Any] = {"type": type, "fields": fields}
        if payload is not None:
            body.update(payload=payload, payload_class=payload_class)
        return self.post(f"/runs/{self.run_id}/events", body)

    def attach(self, kind: str, provider: str, handle: str, **limits: int) -> str:
        """Register a resource the run holds; returns its id (the reaper closes it later)."""
        body = {"kind": kind, "provider": provider, "handle": handle, **limits}
        return str(self.post(f"/runs/{self.run_id}/resources", body)["resource_id"])

    def release_resource(self, resource_id: str) -> dict[str, Any]:
        return self.post(f"/resources/{resource_id}/release")

    def operation(
        self,
        *,
        tool: str,
        action: str,
        resource: str,
        idempotency_key: str,
        perform: Callable[[], Done],
        effect_class: str | None = None,
        approval_timeout_s: float = 600,
        poll_s: float = 2.0,
        **intent: Any,
    ) -> dict[str, Any]:
        """Intent, authorize and dispatch in one call (waiting for a person's approval when
        one is needed) -> ``perform()`` -> outcome: two calls when nothing waits for a
        person. While ``perform`` runs, ``self.levers`` holds the breaker's levers its
        dispatch handed over (None: none); ``Done(fallback_used=...)`` says whether it took one. The idempotency key is the caller's and stays
        the same on every retry, so a replacement worker replays the same operation. If
        ``perform`` raises, the outcome is reported UNKNOWN (nobody knows whether the effect
        happened) and the exception propagates. ``effect_class`` may be left out where the
        tenant's tool contract gives it (a different one is refused: EffectClassMismatch).
        The three steps are public for callers that interleave their own work
        (``effect_start``, ``effect_await_approval``, ``effect_outcome``)."""
        started = self.effect_start(
            tool=tool,
            action=action,
            resource=resource,
            idempotency_key=idempotency_key,
            effect_class=effect_class,
            **intent,
        )
        if started.approval_id is not None:
            started = self.effect_await_approval(started, timeout_s=approval_timeout_s, poll_s=poll_s)
        if started.phase != "DISPATCHED":
            return {"operation_id": started.operation_id, "phase": started.phase}  # decided by an earlier attempt
        self.levers = started.levers
        try:
            done = perform()
        except BaseException:
            self.effect_outcome(started.operation_id, Done(outcome="UNKNOWN"))
            raise
        return {"operation_id": started.operation_id, "phase": self.effect_outcome(started.operation_id, done)}

    def effect_start(
        self,
        *,
        tool: str,
        action: str,
        resource: str,
        idempotency_key: str,
        effect_class: str | None = None,
        credential_lease_id: str | None = None,
        **intent: Any,
    ) -> Effect:
        """Intend, authorize and dispatch, as far as nothing waits for a person, in one call
        (``POST /runs/{run_id}/effects``). Returns the operation's phase: DISPATCHED (call the
        provider now, then ``effect_outcome``; also when an earlier call under the same key
        dispatched it and reported nothing: the provider gets the same idempotency key),
        PENDING_APPROVAL with ``approval_id`` set (``effect_await_approval``), or a phase an
        earlier attempt under the same key already reached (CONFIRMED, FAILED, UNKNOWN,
        DENIED ...: do not call the provider). Every refusal raises its exception. ``flow_key=``
        names the intent's key for the policy's flow control; a limit without room raises
        ``Throttled``, leaving the operation AUTHORIZED: the same call with the same key
        dispatches it after ``retry_after_s``."""
        body = {"tool": tool, "action": action, "resource": resource, "idempotency_key": idempotency_key, **intent}
        if effect_class is not None:
            body["effect_class"] = effect_class
        if credential_lease_id:
            body["credential_lease_id"] = credential_lease_id
        # A record this build cannot read is answered as intended, authorized by nobody; refused here.
        body["reads_schema_versions"] = sorted(self.client.reads)
        started = self.client.readable(self.post(f"/runs/{self.run_id}/effects", body), "operation")
        approval = started.get("approval_id")
        reservation = started.get("reservation_id")
        return Effect(
            str(started["operation_id"]),
            str(started["phase"]),
            str(approval) if approval else None,
            credential_lease_id,
            dispatched=bool(started.get("dispatched")),
            reservation_id=str(reservation) if reservation else None,
            levers=Levers.from_answer(started.get("levers")),
        )

    def effect_await_approval(
        self,
        effect: Effect,
        *,
        timeout_s: float = 600,
        poll_s: float = 2.0,
        on_wait: Callable[[float], None] | None = None,
    ) -> Effect:
        """Wait for a person's decision on ``effect.approval_id`` (the lease keeps renewing);
        once APPROVED, authorize and dispatch. ``on_wait(elapsed_s)`` is called on every poll
        (a progress notification, say). DENIED, EXPIRED, VOID or the timeout raise
        ``ApprovalDenied``: an approval that expires never approves."""
        if effect.approval_id is None:
            return effect
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0)))
            self._check()
            if on_wait is not None:
                on_wait(time.monotonic() - started)
            decided = self.client.get(f"/approvals/{effect.approval_id}")
            if decided["status"] == "APPROVED":
                auth: dict[str, Any] = {}
                if effect.credential_lease_id:
                    auth["credential_lease_id"] = effect.credential_lease_id
                self.post(f"/operations/{effect.operation_id}/authorize", auth)
                dispatched = self.post(f"/operations/{effect.operation_id}/dispatch")
                reservation = dispatched.get("reservation_id")
                return Effect(
                    effect.operation_id,
                    "DISPATCHED",
                    None,
                    effect.credential_lease_id,
                    dispatched=True,
                    reservation_id=str(reservation) if reservation else None,
                    levers=Levers.from_answer(dispatched.get("levers")),
                )
            if decided["status"] in ("DENIED", "EXPIRED", "VOID"):
                raise ApprovalDenied(
                    403, {"error": "APPROVAL_DENIED", "detail": decided.get("reason") or decided["status"].lower()}
                )
        raise ApprovalDenied(408, {"error": "APPROVAL_DENIED", "detail": "no decision before the timeout"})

    def effect_outcome(self, operation_id: str, done: Done) -> str:
        """Report what the provider answered (``Done``; ``Done(outcome="UNKNOWN")`` when
        nobody knows): returns the operation's phase."""
        report: dict[str, Any] = {"outcome": done.outcome}
        if done.provider_request_id:
            report["provider_request_id"] = done.provider_request_id
        if done.provider_ref is not None:
            report["provider_ref"] = done.provider_ref
        if done.actual_cost_cents is not None:
            report["actual_cost_cents"] = done.actual_cost_cents
        if done.error_code:
            report["error_code"] = done.error_code
        if done.fallback_used is not None:
            report["fallback_used"] = done.fallback_used
        return str(self.post(f"/operations/{operation_id}/outcome", report)["phase"])

    def delivery(
        self,
        operation_id: str,
        *,
        status: str,
        provider_event_id: str,
        occurred_at: str,
        message_id: str = "",
    ) -> dict[str, Any]:
        """Record delivery evidence of the operation's current attempt, apart from its
        outcome: ``status`` DELIVERED, BOUNCED or DEFERRED, the provider's event id (recorded
        once), when it happened (ISO 8601 with a zone). Returns the record and the
        delivery state now ({"applied", "replayed", "seq", "delivery": {...}})."""
        report = {"status": status, "provider_event_id": provider_event_id, "occurred_at": occurred_at}
        if message_id:
            report["message_id"] = message_id
        return self.post(f"/operations/{operation_id}/deliveries", report)

    # -- the end --

    def complete(self) -> dict[str, Any]:
        done = self.post(f"/runs/{self.run_id}/complete")
        self._ended = True
        self._stop.set()
        return done

    def release(self) -> dict[str, Any]:
        self._stop.set()
        done = self.client.post(
            f"/runs/{self.run_id}/lease/release", {"owner_id": self.owner_id, "fencing_token": self.token}
        )
        self._ended = True
        return done

    def cancel_run(self, reason: str) -> dict[str, Any]:
        return self.client.post(f"/runs/{self.run_id}/cancel", {"reason": reason})
