"""The MCP gateway's cost (``make bench-gateway``, issue 37): a read-only tool called through
``fenceline-mcp`` against the same tool called directly, at N concurrent MCP sessions.

    direct    N processes, each the MCP SDK's stdio client -> its own sandbox upstream
              (python -m fenceline_client.sandbox_mcp), calling note_read in a loop
    gateway   N processes, each the same client -> fenceline-mcp -> its own sandbox upstream;
              every call a fenced operation of the session's run (intend, authorize, dispatch,
              outcome) against the live app served by the production server: gunicorn with
              console/gunicorn_conf.py, as ``make serve`` starts it

Both halves run in one invocation, one after the other at each N, on the same machine, so their
ratio is what to read (the absolute figures drift with the machine and what else runs on it).
Goal of issue 37: the gateway adds at most 3 ms at p50 and keeps at least 0.5 x the direct
calls/s. Its database, ``fenceline_bench_gateway`` on DATABASE_URL's server, is dropped and
recreated by every run, migrated, warmed up through the gateway (unmeasured) and ANALYZEd.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import DEFAULT_URL, BenchError, Server, django_setup  # noqa: E402

# Dropped and recreated by every run; no other one is (BENCH_GATEWAY_DB names another, for two
# checkouts benchmarking on one server at once).
GATEWAY_DB = os.environ.get("BENCH_GATEWAY_DB") or "fenceline_bench_gateway"
TENANT = "bench-gateway"
BIN = Path(sys.executable).parent
# Each call's arguments differ from the one before (as an agent's calls mostly do): the gateway
# waits for an identical call's outcome report before the next identical call, not for others'.
TOOL = "note_read"
CALLS = itertools.count()
# The tenant's contracts for the sandbox's tools: the read is PURE whatever the upstream says.
CONTRACTS = [
    {"tool": "note_read", "action": "*", "effect_class": "PURE"},
    {"tool": "note_write", "action": "*", "effect_class": "IDEMPOTENT"},
    {"tool": "note_append", "action": "*", "effect_class": "NON_RETRYABLE"},
]
WARMUP_CALLS = 20


def upstream_command() -> list[str]:
    return [sys.executable, "-m", "fenceline_client.sandbox_mcp"]


def session_main(index: int, via: dict[str, str] | None, seconds: float, ready, go, results) -> None:
    """One MCP session in its own process (or, with ``via["fenced_only"]``, the gateway's
    fenced requests alone, by the Python client, without MCP): warm up, wait for ``go``, call
    for ``seconds``; puts ("result", index, (latencies, effect_start latencies)) or ("error", index, text)."""
    import anyio

    try:
        if via is not None and via.get("fenced_only"):
            latencies = fenced_only(index, via, seconds, ready, go)
        else:
            latencies = anyio.run(_session, index, via, seconds, ready, go), []
        results.put(("result", index, latencies))
    except BaseException as exc:  # reported to the parent, which fails the run
        ready.put(("error", index, f"{type(exc).__name__}: {exc}"[:500]))
        results.put(("error", index, f"{type(exc).__name__}: {exc}"[:500]))


async def _session(index: int, via: dict[str, str] | None, seconds: float, ready, go) -> list[float]:
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    if via is None:
        command, *args = upstream_command()
        params = StdioServerParameters(command=command, args=args)
    else:
        argv = ["--external-id", f"{via['prefix']}-{index}", "--", *upstream_command()]
        env = {"PATH": os.environ.get("PATH", ""), "FENCELINE_URL": via["url"], "FENCELINE_TOKEN": via["token"]}
        params = StdioServerParameters(command=str(BIN / "fenceline-mcp"), args=argv, env=env)
    perf = time.perf_counter
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for _ in range(WARMUP_CALLS):
            await _call(session)
        ready.put(("ready", index))
        await anyio.to_thread.run_sync(go.wait)
        latencies: list[float] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = perf()
            await _call(session)
            latencies.append(perf() - started)
    return latencies


def fenced_only(index: int, via: dict[str, str], seconds: float, ready, go) -> tuple[list[float], list[float]]:
    """What the gateway asks of the server per call, and nothing else: effect_start (intend,
    authorize, dispatch) and effect_outcome, through the same Python client."""
    from fenceline_client import client as fl

    client = fl.Client(via["url"], via["token"], timeout=30)
    run_id = client.create_run(external_id=f"{via['prefix']}-{index}")
    perf = time.perf_counter
    starts: list[float] = []  # effect_start alone: the one request before the upstream is called
    with client.lease(run_id, ttl_s=600, owner_id=f"bench-fenced-{index}") as lease:

        def one(n: int) -> None:
            started = perf()
            effect = lease.effect_start(
                tool=TOOL, action=TOOL, resource="sandbox", idempotency_key=f"{run_id}-{n}", args_digest="sha256:0"
            )
            starts.append(perf() - started)
            lease.effect_outcome(effect.operation_id, fl.Done(outcome="CONFIRMED", provider_request_id="sha256:1"))

        for n in range(WARMUP_CALLS):
            one(n)
        ready.put(("ready", index))
        go.wait()
        latencies: list[float] = []
        starts.clear()
        deadline, n = time.monotonic() + seconds, WARMUP_CALLS
        while time.monotonic() < deadline:
            started = perf()
            one(n := n + 1)
            latencies.append(perf() - started)
    return latencies, starts


async def _call(session) -> None:
    result = await session.call_tool(TOOL, {"key": f"bench-{next(CALLS)}"})
    if result.is_error:
        raise RuntimeError(f"{TOOL} answered isError: {result.content[0].text if result.content else ''}")


def phase(sessions: int, via: dict[str, str] | None, seconds: float) -> dict[str, float]:
    """N sessions at once (through the gateway or the client: each with a worker identity of
    its own): calls/s over the window and the p50 of every call's latency (ms)."""
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    own = tokens(via["prefix"], sessions) if via is not None else [""] * sessions
    procs = [
        ctx.Process(target=session_main, args=(i, via and {**via, "token": own[i]}, seconds, ready, go, results))
        for i in range(sessions)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            kind, index, *rest = ready.get(timeout=120)
            if kind == "error":
                raise RuntimeError(f"session {index}: {rest[0]}")
        go.set()
        latencies: list[float] = []
        starts: list[float] = []
        for _ in procs:
            kind, index, payload = results.get(timeout=seconds + 120)
            if kind == "error":
                raise RuntimeError(f"session {index}: {payload}")
            latencies += payload[0]
            starts += payload[1]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return {
        "calls": len(latencies),
        "per_s": len(latencies) / seconds,
        "p50_ms": statistics.median(latencies) * 1000,
        "start_p50_ms": statistics.median(starts) * 1000 if starts else 0.0,
    }


def recreate_database(server: Server, name: str) -> None:
    from psycopg import sql

    if name != GATEWAY_DB:
        raise BenchError(f"refusing to drop database {name!r}: only {GATEWAY_DB} is recreated")
    with server.connect_admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def prepare(server: Server) -> None:
    """Recreate and migrate the database, then a tenant with the sandbox's contracts."""
    recreate_database(server, GATEWAY_DB)
    django_setup(server.url_for(GATEWAY_DB))
    from django.core.management import call_command

    from ledger.services.authority.policy import policy_change
    from ledger.services.tenancy.tenants import tenant_ensure

    call_command("migrate", verbosity=0, interactive=False)
    tenant, _ = tenant_ensure(slug=TENANT)
    policy_change(tenant=tenant, document={"tool_contracts": CONTRACTS}, changed_by="bench", reason="gateway bench")


def tokens(label: str, sessions: int) -> list[str]:
    """A worker identity per session of a phase, as each agent host has its own: every
    fenceline-mcp process reports a boot, and boots of one identity that never reported an
    exit form a restart episode, which the restart budget ends in quarantine."""
    from ledger.models import Tenant
    from ledger.services.fleet.workers import worker_create

    tenant = Tenant.objects.get(slug=TENANT)
    return [worker_create(tenant=tenant, name=f"{label}-{i}")[1] for i in range(sessions)]


def report(n: int, direct: dict[str, float], gateway: dict[str, float], fenced: dict[str, float]) -> str:
    added = gateway["p50_ms"] - direct["p50_ms"]
    ratio = gateway["per_s"] / direct["per_s"]
    return (
        f"N={n}  direct {direct['per_s']:8.1f} calls/s p50 {direct['p50_ms']:6.2f} ms ({direct['calls']} calls)\n"
        f"     gateway {gateway['per_s']:8.1f} calls/s p50 {gateway['p50_ms']:6.2f} ms ({gateway['calls']} calls)\n"
        f"     of it, the fenced requests alone (client, no MCP) {fenced['per_s']:8.1f} calls/s "
        f"p50 {fenced['p50_ms']:6.2f} ms, effect_start alone p50 {fenced['start_p50_ms']:6.2f} ms\n"
        f"     added p50 {added:+.2f} ms (goal <= 3 ms: {'met' if added <= 3 else 'NOT met'}); "
        f"calls/s ratio {ratio:.2f} x direct (goal >= 0.5: {'met' if ratio >= 0.5 else 'NOT met'})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", "-s", type=float, default=10, help="each phase's window (default 10)")
    parser.add_argument("--sessions", default="1,4", help="concurrent MCP sessions, comma-separated (default 1,4)")
    parser.add_argument("--workers", type=int, default=0, help="gunicorn workers (default: console/gunicorn_conf.py's)")
    options = parser.parse_args(argv)
    counts = [int(n) for n in options.sessions.split(",")]
    server = Server(os.environ.get("DATABASE_URL") or DEFAULT_URL)
    prepare(server)
    from console import gunicorn_conf
    from tests.served import Gunicorn

    env = {
        **os.environ,
        "DATABASE_URL": server.url_for(GATEWAY_DB),
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SECRET_KEY": "bench-" + uuid.uuid4().hex,
        "DB_CONN_MAX_AGE": "300",
        "FENCELINE_LOG_FORMAT": "plain",
    }
    app = Gunicorn(env=env, workers=options.workers or gunicorn_conf.workers, config="python:console.gunicorn_conf")
    try:
        app.wait_ready()
        phase(1, {"url": app.url, "prefix": "bench-gw-warmup"}, 3)  # unmeasured
        with server.connect(GATEWAY_DB) as conn:
            conn.execute("ANALYZE")
        load = os.getloadavg()[0]
        print(f"gunicorn (console/gunicorn_conf.py) at {app.url}; load average {load:.2f} on {os.cpu_count()} cores")
        print(f"tool {TOOL} of python -m fenceline_client.sandbox_mcp over stdio; {options.seconds:g} s per phase")
        for n in counts:
            direct = phase(n, None, options.seconds)
            via = {"url": app.url, "prefix": f"bench-gw-n{n}"}
            gateway = phase(n, via, options.seconds)
            fenced = phase(n, {**via, "prefix": f"bench-fenced-n{n}", "fenced_only": "1"}, options.seconds)
            print(report(n, direct, gateway, fenced), flush=True)
    finally:
        app.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
