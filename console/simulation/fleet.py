"""The fleet simulator's supervisor (``manage.py simulate``): real worker processes built on
the client, against a real API server and the sandbox provider, with chaos, for S seconds.

    supervisor (this process)
      ├── API server thread      the project's WSGI app (or ``--url`` for one already running)
      ├── sandbox provider       charges under idempotency keys; drops, slows or fails some
      ├── jobs, every second     reap leases and resources, enforce drains and run limits,
      │                          and the reconciler job: UNKNOWNs looked up at the provider
      ├── N worker processes     ``python -m fenceline_client.simulated_worker`` (+1 with a bad config)
      │     chaos: SIGSTOP past the TTL then SIGCONT, SIGKILL, SIGTERM (drain); restarted
      ├── M agent hosts          ``python -m fenceline_client.simulated_mcp_host``: the MCP SDK's
      │     client -> ``fenceline-mcp`` -> the sandbox MCP server, one run per MCP session
      └── A agent hosts          ``python -m fenceline_client.simulated_agent_host``: an OpenAI
            Agents SDK agent and a LangGraph graph in turn, scripted models, their tools fenced
            through the adapters; a refund waits for a person (the simulator approves nothing)

Everything it reports is read back from the database (and the provider's own books) at the
end, never counted on the side: what the console shows is what the report says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.db import close_old_connections
from django.db.models import Count, Q, Sum
from django.test import override_settings
from django.utils import timezone

from approvals.models import OPEN_CASE_STATUSES, PEOPLE_CASE_STATUSES, CaseStatus, ReconciliationCase
from approvals.services.lookups import cases_look_up
from console.simulation.provider import SandboxProvider
from fenceline_client.evidence_verifier import BROKEN
from ledger.models import RESTART_EPISODE_BEGINS, Operation, Run, Worker, WorkerBoot, WorkerDrain
from ledger.selectors import MCP_SESSION
from ledger.services.authority.policy import policy_change
from ledger.services.evidence.verification import run_verify
from ledger.services.fence.runs import run_create
from ledger.services.fleet.workers import worker_create
from ledger.services.reconciliation.http import HttpReconciler
from ledger.services.reconciliation.registry import register, unregister
from ledger.services.tenancy.roles import role_grant
from ledger.services.tenancy.tenants import tenant_ensure
from ledger.states import Phase, RunStatus, WorkerStatus
from ledger.tasks import (
    enforce_drains_task,
    enforce_run_limits_task,
    expire_reservations_task,
    reap_leases_task,
    reap_resources_task,
)

RECONCILER = "sandbox-payments"  # the tool contract's reconciler, registered at the sandbox's URL
CONSOLE_ROLES = {"viewer": "viewer", "operator": "operator", "approver": "approver", "admin": "admin"}
JOBS = (reap_leases_task, enforce_run_limits_task, reap_resources_task, expire_reservations_task, enforce_drains_task)
# A case is looked up only once the fenced owner can no longer reach the provider: its
# request timeout is 2 x TTL, and a paused process is held for TTL + 2 s.
LOOKUP_AFTER_S = 12
# The sandbox MCP server's tools (fenceline_client.sandbox_mcp), as the tenant's contracts say.
MCP_CONTRACTS = [
    {"tool": "note_read", "action": "*", "effect_class": "PURE"},
    {"tool": "note_write", "action": "*", "effect_class": "IDEMPOTENT"},
    {"tool": "note_append", "action": "*", "effect_class": "NON_RETRYABLE"},
]
MCP_RUN_PREFIX = "mcp:"  # the external ids of the agent hosts' sessions
# The framework agents' tools (fenceline_client.simulated_agent_host); refunds need a person.
AGENT_CONTRACTS = [
    {"tool": "crm_lookup", "action": "*", "effect_class": "PURE"},
    {"tool": "crm_note", "action": "*", "effect_class": "IDEMPOTENT"},
    {"tool": "crm_refund", "action": "*", "effect_class": "NON_RETRYABLE"},
]
AGENT_RUN_PREFIX = "agent:"  # the external ids of the framework agents' runs: agent:<framework>:...
AGENT_FRAMEWORKS = ("openai-agents", "langgraph")
EXIT_NAMES = {0: "drained", 3: "bad config", 4: "quarantined", 5: "told to stop", -9: "killed"}


@dataclass
class Settings:
    seconds: int = 60
    workers: int = 4
    ttl: int = 3
    steps: int = 4
    seed: int = 1
    drop: float = 0.10
    slow: float = 0.05
    fail: float = 0.05
    people_share: float = 0.25  # share of keys the sandbox answers "cannot tell" about: left to people
    url: str = ""
    mcp_hosts: int = 1  # agent hosts whose tool calls go through the MCP gateway
    every: int = 5  # seconds between two progress lines
    agent_hosts: int = 1  # agent hosts running the OpenAI Agents SDK and LangGraph adapters


@dataclass
class Report:
    tenant: str
    seconds: float
    runs: int
    runs_completed: int
    dispatched: int
    confirmed: int
    failed: int
    stale_refused: int
    unknown_opened: int
    reconciled_by_reconciler: int
    reconciled_by_people: int
    handed_to_people: int
    still_looked_up: int
    drains: int
    drains_stopped: int
    boots: int
    restart_episodes: int
    quarantines: int
    chains_verified: int
    chains_broken: int
    provider_charges: int
    provider_replayed_keys: int
    provider_faults: dict[str, int]
    effects_missing_from_ledger: int
    # through the MCP gateway: its sessions (runs with an x.mcp.session event) and their calls by phase
    mcp_sessions: int = 0
    mcp_calls: dict[str, int] = field(default_factory=dict)
    # through the framework adapters, by framework: {"runs", "completed", "calls", "asked"} (calls
    # left PENDING_APPROVAL: their approvals wait while the host lives, VOID once it stops)
    agent_runs: dict[str, dict[str, int]] = field(default_factory=dict)
    # operation records by schema version, and how many hold the structured provider_ref
    # (written by both builds' reports: the server dual-writes in EXPAND)
    versions: dict[str, int] = field(default_factory=dict)
    with_provider_ref: int = 0
    old_build_workers: int = 0
    chaos: dict[str, int] = field(default_factory=dict)
    exits: dict[str, int] = field(default_factory=dict)
    logs: str = ""

    def lines(self) -> list[str]:
        faults = ", ".join(f"{name} {count}" for name, count in self.provider_faults.items())
        chaos = ", ".join(f"{name} {count}" for name, count in self.chaos.items()) or "none"
        versions = ", ".join(f"v{version}: {count}" for version, count in sorted(self.versions.items())) or "none"
        return [
            f"Fleet simulation on tenant {self.tenant!r}, {self.seconds:.0f} s",
            f"  runs                 {self.runs} ({self.runs_completed} completed)",
            f"  dispatched           {self.dispatched} ({self.confirmed} confirmed, {self.failed} failed)",
            f"  stale refused        {self.stale_refused}",
            f"  UNKNOWN opened       {self.unknown_opened}",
            f"  reconciled           {self.reconciled_by_reconciler} by reconciler:{RECONCILER}, "
            f"{self.reconciled_by_people} by people; {self.handed_to_people} handed to people (cannot tell), "
            f"{self.still_looked_up} still being looked up",
            f"  drains               {self.drains} ({self.drains_stopped} reached STOPPED)",
            f"  boots                {self.boots} in {self.restart_episodes} restart episodes",
            f"  quarantines          {self.quarantines}",
            f"  chains verified      {self.chains_verified} ({self.chains_broken} broken)",
            f"  provider             {self.provider_charges} charges, {self.provider_replayed_keys} keys "
            f"replayed, faults: {faults}",
            f"  effects the ledger missed  {self.effects_missing_from_ledger}",
            f"  MCP gateway          {self.mcp_sessions} sessions, {sum(self.mcp_calls.values())} tool calls "
            f"({', '.join(f'{n} {phase}' for phase, n in sorted(self.mcp_calls.items())) or 'none'})",
            f"  agent adapters       {self.agent_line()}",
            f"  upgrade window       operation records {versions}; {self.with_provider_ref} with provider_ref; "
            f"{self.old_build_workers} of the workers on the old build",
            f"  chaos                {chaos}",
            f"  logs                 {self.logs} (each worker's, and the server's in server.log)",
        ]

    def agent_line(self) -> str:
        return (
            "; ".join(
                f"{name} {n['runs']} runs ({n['completed']} completed), {n['calls']} tool calls, "
                f"{n['asked']} asked a person (the simulator approves nothing)"
                for name, n in self.agent_runs.items()
            )
            or "none"
        )


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


class ApiServer:
    """The project's WSGI application on a free port, in daemon threads."""

    def __init__(self) -> None:
        self.server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler, allow_reuse_address=False)
        self.server.daemon_threads = True
        self.server.set_app(WSGIHandler())
        self.thread = threading.Thread(target=self.server.serve_forever, name="sim-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> ApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Slot:
    """One worker identity and the process currently running as it."""

    name: str
    token: str
    bad_config: bool = False
    old_build: bool = False  # the build before operation.provider_ref (reads version 1 only)
    mcp_host: bool = False  # an agent host calling tools through fenceline-mcp
    agent_host: int = -1  # >= 0: a framework agent host (its index: which framework goes first)
    process: subprocess.Popen[bytes] | None = None
    restart_at: float = 0.0
    resume_at: float = 0.0  # when a SIGSTOPped process gets its SIGCONT
    retired: bool = False  # quarantined or told to stop: the supervisor leaves it down
    log: Path | None = None  # the process's output, from ``log_from`` on
    log_from: int = 0

    def booted(self) -> bool:
        """Whether the current process has reported its boot (and so handles SIGTERM by
        draining): until then a signal would meet an interpreter still importing."""
        if self.log is None:
            return False
        with self.log.open("rb") as output:
            output.seek(self.log_from)
            return b"BOOTED" in output.read()


class Fleet:
    def __init__(self, options: Settings, say: Callable[[str], None]) -> None:
        self.options = options
        self.say = say
        self.random = random.Random(options.seed)  # noqa: S311 - chaos, not security
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        self.tenant, _ = tenant_ensure(slug=f"sim-{stamp}", name=f"Fleet simulation {stamp}")
        self.logs = Path(tempfile.mkdtemp(prefix=f"fenceline-sim-{stamp}-"))
        self.runs_file = self.logs / "runs.json"
        self.chaos: dict[str, int] = {"paused": 0, "killed": 0, "terminated": 0}
        self.exits: dict[str, int] = {}
        self.slots: list[Slot] = []
        self.dispatcher: Worker | None = None

    # -- setup --

    def setup(self) -> None:
        policy_change(
            tenant=self.tenant,
            document={
                "restart_budget": {"max_restarts": 2, "window_s": 600},
                # Every simulated worker boots before it leases: none is admitted without it.
                "admission": {"boot_report_required": True},
                # What a charge is comes from the contract, and its UNKNOWNs are looked up first;
                # the sandbox MCP server's tools are what their contracts say, not their hints.
                "tool_contracts": [
                    {
                        "tool": "payments",
                        "action": "charge",
                        "effect_class": "NON_RETRYABLE",
                        "provider": RECONCILER,
                        "reconciler": RECONCILER,
                        "worst_case_cost_cents": 500,
                    },
                    *MCP_CONTRACTS,
                    *AGENT_CONTRACTS,
                ],
                "human_approval_tools": ["crm_refund"],
            },
            changed_by="simulator",
            reason="a small restart budget, so the crash-looping worker is quarantined within seconds; "
            "boot reports required; the payments contract with its reconciler; the agents' refunds need a person",
        )
        users = set(get_user_model().objects.filter(username__in=CONSOLE_ROLES).values_list("username", flat=True))
        for username in sorted(users):  # the demo's console users see the simulation too
            role_grant(username=username, tenant=self.tenant, role=CONSOLE_ROLES[username])
        self.dispatcher, _ = worker_create(tenant=self.tenant, name="sim-dispatcher")
        for index in range(self.options.workers):
            worker, token = worker_create(tenant=self.tenant, name=f"sim-worker-{index + 1}")
            # A rolling deploy half done: every other worker still runs the old build.
            self.slots.append(Slot(name=worker.name, token=token, old_build=index % 2 == 1))
        worker, token = worker_create(tenant=self.tenant, name="sim-bad-config")
        self.slots.append(Slot(name=worker.name, token=token, bad_config=True))
        for index in range(self.options.mcp_hosts):
            worker, token = worker_create(tenant=self.tenant, name=f"sim-mcp-host-{index + 1}")
            self.slots.append(Slot(name=worker.name, token=token, mcp_host=True))
        for index in range(self.options.agent_hosts):
            worker, token = worker_create(tenant=self.tenant, name=f"sim-agent-host-{index + 1}")
            self.slots.append(Slot(name=worker.name, token=token, agent_host=index))
        self.top_up_runs()

    def top_up_runs(self) -> None:
        """Keep two runs of work per worker on offer, and tell the workers which."""
        if self.dispatcher is None:
            raise RuntimeError("setup() first")
        active = list(  # a run waiting for a person's decision is not on offer, nor an agent host's
            Run.objects.filter(tenant=self.tenant, status=RunStatus.ACTIVE)
            .exclude(cases__status__in=OPEN_CASE_STATUSES)
            .exclude(external_id__startswith=MCP_RUN_PREFIX)
            .exclude(external_id__startswith=AGENT_RUN_PREFIX)
            .values_list("pk", flat=True)
            .distinct()
        )
        for _ in range(max(0, 2 * self.options.workers - len(active))):
            run, _ = run_create(worker=self.dispatcher, schema_version=1)
            active.append(run.pk)
        partial = self.runs_file.with_suffix(".tmp")
        partial.write_text(json.dumps([str(pk) for pk in active]))
        partial.replace(self.runs_file)  # a worker never reads half a list

    # -- processes --

    def spawn(self, slot: Slot, env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "fenceline_client.simulated_worker", "--ttl", str(self.options.ttl)]
        command += ["--steps", str(self.options.steps)] + (["--bad-config"] if slot.bad_config else [])
        command += ["--old-build"] if slot.old_build else []
        if slot.mcp_host:
            command = [sys.executable, "-m", "fenceline_client.simulated_mcp_host", "--name", slot.name]
        if slot.agent_host >= 0:
            command = [sys.executable, "-m", "fenceline_client.simulated_agent_host", "--name", slot.name]
            command += ["--index", str(slot.agent_host)]
        slot.log = self.logs / f"{slot.name}.log"
        log = slot.log.open("a")
        slot.log_from = log.tell()
        slot.process = subprocess.Popen(  # noqa: S603 - our own module, no shell
            command,
            env={**env, "FENCELINE_TOKEN": slot.token},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=settings.BASE_DIR,
        )
        log.close()

    def supervise(self, env: dict[str, str], now: float) -> None:
        for slot in self.slots:
            process = slot.process
            if slot.resume_at and now >= slot.resume_at and process is not None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                slot.resume_at = 0.0
            if process is not None and process.poll() is not None:
                name = EXIT_NAMES.get(process.returncode, f"exit {process.returncode}")
                self.exits[name] = self.exits.get(name, 0) + 1
                slot.process = None
                slot.retired = process.returncode in (4, 5)
                slot.restart_at = now + 0.5
            if slot.process is None and not slot.retired and now >= slot.restart_at:
                self.spawn(slot, env)

    def healthy(self) -> list[Slot]:
        """The workers chaos may strike: running, booted, not crash-looping, not paused."""
        return [
            s
            for s in self.slots
            if s.process is not None
            and not (s.bad_config or s.mcp_host or s.agent_host >= 0 or s.resume_at)
            and s.booted()
        ]

    def strike(self, kind: str, now: float) -> bool:
        """One chaos event on the healthy worker that was struck least recently; False when
        no worker is healthy now (the event waits for one)."""
        targets = self.healthy()
        if not targets:
            return False
        slot = targets[self.chaos[kind] % len(targets)]
        process = slot.process
        if process is None:
            return False
        if kind == "paused":  # a long GC pause or a frozen VM: the lease expires under it
            process.send_signal(signal.SIGSTOP)
            slot.resume_at = now + self.options.ttl + 2
        elif kind == "killed":
            process.send_signal(signal.SIGKILL)
        else:
            process.send_signal(signal.SIGTERM)  # the orchestrator's stop: drain, then exit 0
        self.chaos[kind] += 1
        return True

    def chaos_plan(self) -> list[tuple[float, str]]:
        """First one of each, at fixed times, then random events every few seconds."""
        plan = [(3.0, "paused"), (6.0, "killed"), (9.0, "terminated")]
        at = 12.0
        while at < self.options.seconds - 4:
            plan.append((at, self.random.choice(("paused", "killed", "terminated"))))
            at += self.random.uniform(2.5, 5.0)
        return [(t, kind) for t, kind in plan if t < self.options.seconds - 2]

    # -- jobs --

    def jobs(self) -> None:
        for job in JOBS:
            job()
        cases_look_up()
        close_old_connections()

    # -- the reconciler --

    @staticmethod
    def reconciler_config(url: str) -> dict[str, Any]:
        config = {k: v for k, v in settings.FENCELINE["RECONCILERS"][RECONCILER].items() if k != "provider"}
        return {**config, "base_url": url}

    @staticmethod
    def lookup_settings() -> dict[str, Any]:
        """The lookups wait until a fenced owner can no longer reach the provider, then
        back off in seconds rather than minutes (a simulation is short)."""
        return {**settings.FENCELINE, "RECONCILE_AFTER_S": LOOKUP_AFTER_S, "RECONCILE_BACKOFF_BASE_S": 2}

    # -- the run --

    def run(self) -> Report:
        started = time.monotonic()
        self.setup()
        provider = SandboxProvider(
            drop=self.options.drop,
            slow=self.options.slow,
            fail=self.options.fail,
            cannot_tell=self.options.people_share,
            seed=self.options.seed,
        ).start()
        register(RECONCILER, HttpReconciler(RECONCILER, self.reconciler_config(provider.url)), provider=RECONCILER)
        lookups = override_settings(FENCELINE=self.lookup_settings())
        lookups.enable()
        server = None if self.options.url else ApiServer().start()
        url = self.options.url or server.url  # type: ignore[union-attr]
        env = {
            **os.environ,
            "FENCELINE_URL": url,
            "PROVIDER_URL": provider.url,
            "RUNS_FILE": str(self.runs_file),
            "PYTHONUNBUFFERED": "1",
        }
        request_log = logging.getLogger("django.request")
        level = request_log.level
        if server is not None:  # its refusals (409s) are the point; the progress line tells them
            request_log.setLevel(logging.ERROR)
        self.say(f"tenant {self.tenant.slug}, API {url}, provider {provider.url}, logs {self.logs}")
        plan = self.chaos_plan()
        try:
            last_shown = 0.0
            while (elapsed := time.monotonic() - started) < self.options.seconds:
                self.supervise(env, elapsed)
                while plan and plan[0][0] <= elapsed and self.strike(plan[0][1], elapsed):
                    plan.pop(0)  # an event that found no healthy worker waits for one
                self.top_up_runs()
                self.jobs()
                if elapsed - last_shown >= self.options.every:
                    self.say(self.progress(elapsed))
                    last_shown = elapsed
                time.sleep(0.5)
            self.say("time is up: SIGTERM to every worker (drain, checkpoint, release, exit)")
            self.stop_all(time.monotonic() - started)
            self.jobs()
            return self.report(provider, time.monotonic() - started)
        finally:
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is None:
                    slot.process.kill()
            provider.stop()
            unregister(RECONCILER)
            lookups.disable()
            if server is not None:
                server.stop()
            request_log.setLevel(level)

    def stop_all(self, elapsed: float) -> None:
        for slot in self.slots:
            slot.retired = True
            if slot.process is not None and slot.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(signal.SIGCONT)
                    slot.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(s.process is not None for s in self.slots):
            self.supervise({}, elapsed)
            self.jobs()
            time.sleep(0.2)

    def progress(self, elapsed: float) -> str:
        ops = Operation.objects.filter(tenant=self.tenant)
        up = sum(1 for s in self.slots if s.process is not None and not s.resume_at)
        completed = Run.objects.filter(tenant=self.tenant, status=RunStatus.COMPLETED).count()
        cases = ReconciliationCase.objects.filter(tenant=self.tenant)
        quarantined = Worker.objects.filter(tenant=self.tenant, status=WorkerStatus.QUARANTINED).count()
        return (
            f"[{elapsed:5.1f}/{self.options.seconds}s] workers up {up}/{len(self.slots)}"
            f" · runs completed {completed} · dispatched {ops.exclude(dispatched_at=None).count()}"
            f" · UNKNOWN cases {cases.count()} ({cases.exclude(status=CaseStatus.RESOLVED).count()} open)"
            f" · quarantined {quarantined}"
        )

    def report(self, provider: SandboxProvider, elapsed: float) -> Report:
        tenant = self.tenant
        ops = Operation.objects.filter(tenant=tenant)
        cases = ReconciliationCase.objects.filter(tenant=tenant)
        runs = Run.objects.filter(tenant=tenant)
        verified = broken = 0
        for run_id in runs.values_list("pk", flat=True):
            if run_verify(run_id=run_id, seal=True).status != BROKEN:
                verified += 1
            else:
                broken += 1
        recorded = set(
            ops.filter(Q(phase=Phase.CONFIRMED) | Q(phase=Phase.RECONCILED, reconciliation="HAPPENED")).values_list(
                "idempotency_key", flat=True
            )
        )
        stats = provider.ledger.stats()
        with provider.ledger.lock:
            charged = set(provider.ledger.charges)
        boots = WorkerBoot.objects.filter(tenant=tenant)
        return Report(
            tenant=tenant.slug,
            seconds=elapsed,
            runs=runs.count(),
            runs_completed=runs.filter(status=RunStatus.COMPLETED).count(),
            dispatched=ops.exclude(dispatched_at=None).count(),
            confirmed=ops.filter(phase=Phase.CONFIRMED).count(),
            failed=ops.filter(phase=Phase.FAILED).count(),
            stale_refused=runs.aggregate(n=Sum("stale_rejections"))["n"] or 0,
            unknown_opened=cases.count(),
            reconciled_by_reconciler=cases.filter(resolved_by=f"reconciler:{RECONCILER}").count(),
            reconciled_by_people=cases.filter(status=CaseStatus.RESOLVED)
            .exclude(resolved_by__startswith="reconciler:")
            .count(),
            handed_to_people=cases.filter(status__in=PEOPLE_CASE_STATUSES).count(),
            still_looked_up=cases.filter(status=CaseStatus.LOOKUP).count(),
            drains=WorkerDrain.objects.filter(tenant=tenant).count(),
            drains_stopped=WorkerDrain.objects.filter(tenant=tenant).exclude(stopped_at=None).count(),
            boots=boots.count(),
            restart_episodes=boots.filter(RESTART_EPISODE_BEGINS).count(),
            quarantines=Worker.objects.filter(tenant=tenant, status=WorkerStatus.QUARANTINED).count(),
            chains_verified=verified,
            chains_broken=broken,
            provider_charges=stats["charges"],
            provider_replayed_keys=stats["replayed_keys"],
            provider_faults=stats["faults"],
            effects_missing_from_ledger=len(charged - recorded - self.undecided_keys()),
            **self.mcp_counts(),
            agent_runs=self.agent_counts(),
            versions={str(v): n for v, n in ops.values_list("schema_version").annotate(n=Count("pk")).order_by()},
            with_provider_ref=ops.exclude(provider_ref__isnull=True).count(),
            old_build_workers=sum(1 for slot in self.slots if slot.old_build),
            chaos=dict(self.chaos),
            exits=dict(self.exits),
            logs=str(self.logs),
        )

    def mcp_counts(self) -> dict[str, Any]:
        """The MCP gateway's sessions (each a run it recorded with x.mcp.session) and their
        tool calls by phase, as the run pages show them."""
        sessions = Run.objects.filter(tenant=self.tenant, events__type=MCP_SESSION).distinct()
        calls = Operation.objects.filter(tenant=self.tenant, run__in=sessions).values_list("phase")
        return {
            "mcp_sessions": sessions.count(),
            "mcp_calls": dict(calls.annotate(n=Count("pk")).order_by()),
        }

    def agent_counts(self) -> dict[str, dict[str, int]]:
        """The framework agents' runs (by the external id their host gives them), how many
        completed, their tool calls (operations) and those that asked a person."""
        counts: dict[str, dict[str, int]] = {}
        for framework in AGENT_FRAMEWORKS:
            runs = Run.objects.filter(tenant=self.tenant, external_id__startswith=f"{AGENT_RUN_PREFIX}{framework}:")
            if not runs.exists():
                continue
            calls = Operation.objects.filter(tenant=self.tenant, run__in=runs)
            counts[framework] = {
                "runs": runs.count(),
                "completed": runs.filter(status=RunStatus.COMPLETED).count(),
                "calls": calls.count(),
                "asked": calls.filter(phase=Phase.PENDING_APPROVAL).count(),
            }
        return counts

    def undecided_keys(self) -> set[str]:
        """Keys still UNKNOWN (a person's to decide): in doubt, not missed."""
        return set(
            Operation.objects.filter(tenant=self.tenant, phase__in=(Phase.UNKNOWN, Phase.DISPATCHED)).values_list(
                "idempotency_key", flat=True
            )
        )


# What the in-process server and jobs log per request and per job run: to server.log, not the
# terminal, where the progress lines are.
CHATTY_LOGGERS = ("fenceline.request", "fenceline.job", "django.server", "django.request", "kombu", "celery")


@contextlib.contextmanager
def logs_to(path: Path) -> Iterator[None]:
    """The chatty loggers write to ``path`` (and only there) for the duration."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    saved = {}
    for name in CHATTY_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (logger.handlers, logger.propagate)
        logger.handlers, logger.propagate = [handler], False
    try:
        yield
    finally:
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
        handler.close()


def simulate(options: Settings, say: Callable[[str], None]) -> Report:
    fleet = Fleet(options, say)
    with logs_to(fleet.logs / "server.log"):
        report = fleet.run()
    for line in report.lines():
        say(line)
    return report


def report_json(report: Report) -> str:
    return json.dumps(asdict(report), indent=2)
