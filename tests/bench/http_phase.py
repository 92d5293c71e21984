"""The HTTP phase of ``tests/bench/fenced_transitions.py``: the same fenced cycle as the
plain phase, made by N client processes with the Python worker client (``fenceline_client``)
against gunicorn serving the project's WSGI application.

    gunicorn console.wsgi:application --workers W --worker-class gthread --threads 1 --keep-alive 75
        DB_CONN_MAX_AGE=300 (persistent database connections, as docs/production.md asks)
    N client processes:  create_run -> lease (acquire, a renewal thread) ->
        20 x lease.operation(start: intent, authorize and dispatch in one call
                             -> outcome CONFIRMED) -> release

Counted as in the plain phase: acquire, intend, authorize, dispatch, outcome, release. A
client that starts an effect in one call (``POST /runs/{run_id}/effects``) makes three of
those transitions in one request, counted as three (its latency is the "start" kind); one
that walks the separate calls makes one per request. Run creation and lease renewals are
not counted. Latencies are the client's (request sent to answer parsed). Effects per second
are the outcomes reported per second; requests per effect, the counted requests but acquire
and release per outcome.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HTTP_KINDS = ("acquire", "start", "intend", "authorize", "dispatch", "outcome", "release")
# Transitions per request of each kind: a start is intent, authorize and dispatch.
TRANSITIONS = {"start": 3}
ROOT = Path(__file__).resolve().parents[2]


def kind_of(method: str, path: str) -> str | None:
    """Which counted transition a request is (None: setup or a renewal)."""
    if method != "POST":
        return None
    tail = path.rsplit("/", 1)[-1]
    if path.endswith("/lease"):
        return "acquire"
    if path.endswith("/lease/release"):
        return "release"
    if path.endswith("/operations"):
        return "intend"
    if path.endswith("/effects"):
        return "start"
    return tail if tail in ("authorize", "dispatch", "outcome") else None


def client_main(index, url, token, ops_per_lease, seconds, key_prefix, counters, ready, go, start_at, results, tool):
    """One client process: ("ready", i), then ("result", i, {...}) or ("error", i, text)."""
    try:
        sys.path.insert(0, str(ROOT))
        from fenceline_client import client as fl

        latencies: dict[str, list[float]] = {kind: [] for kind in HTTP_KINDS}
        count = 0
        runs = 0
        perf = time.perf_counter

        class Counting(fl.Client):
            def call(self, method, path, body=None):
                nonlocal count
                started = perf()
                answer = super().call(method, path, body)
                kind = kind_of(method, path)
                if kind is not None:
                    latencies[kind].append(perf() - started)
                    count += TRANSITIONS.get(kind, 1)
                    counters[index] = count
                return answer

        client = Counting(url, token, timeout=30)
        client.heartbeat()  # the connection is up before the clock starts (not counted)
        ready.put(("ready", index))
        go.wait()
        deadline = start_at.value + seconds
        seq = 0
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        while time.monotonic() < deadline:
            run_id = client.create_run()
            runs += 1
            with client.lease(run_id, ttl_s=600, owner_id=f"bench-http-{index}") as lease:
                for _ in range(ops_per_lease):
                    if time.monotonic() >= deadline:
                        break
                    seq += 1
                    lease.operation(
                        tool=tool[0],
                        action=tool[1],
                        resource=f"bench://{index}/{seq}",
                        effect_class="IDEMPOTENT",
                        idempotency_key=f"{key_prefix}-{index}-{seq}",
                        perform=lambda: fl.Done(provider_request_id="bench"),
                    )
        finished = time.monotonic()
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        results.put(
            (
                "result",
                index,
                {
                    "count": count,
                    "runs": runs,
                    "finished": finished,
                    "latencies": latencies,
                    "cpu_s": (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime),
                    "sys_s": cpu_after.ru_stime - cpu_before.ru_stime,
                    "preempted": cpu_after.ru_nivcsw - cpu_before.ru_nivcsw,
                },
            )
        )
    except BaseException as exc:  # reported to the parent, which fails the run
        line = f"{type(exc).__name__}: {exc}"[:500]
        try:
            ready.put(("error", index, line))
            results.put(("error", index, line))
        finally:
            sys.exit(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_cpu_s(pids: list[int]) -> float:
    """utime + stime of these processes, from /proc (0 for one that is gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# The production server options measured side by side (http_floor.py --servers, make bench
# --http-server): gunicorn's gthread worker with one thread (the HTTP phase's default: each
# client keeps its connection to one thread), the production configuration
# (console/gunicorn_conf.py: console.serving.ThreadWorker, 16 threads), gunicorn's sync worker
# (no kept connections: a TCP connection per request), and uvicorn serving console.asgi (the
# views stay sync: Django runs each in a thread of its own, as the ORM's transactions need).
SERVERS = ("gthread", "production", "sync", "uvicorn")


class Gunicorn:
    """gunicorn (or, as ``server="uvicorn"``, uvicorn) serving the project against the
    benchmark database, on a free port."""

    def __init__(self, database_url: str, workers: int, server: str = "gthread") -> None:
        if server not in SERVERS:
            raise ValueError(f"server must be one of {', '.join(SERVERS)}")
        self.server = server
        self.port = free_port()
        self.workers = workers
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DB_CONN_MAX_AGE": "300",
            "DJANGO_DEBUG": "0",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DJANGO_SECRET_KEY": "bench-" + uuid.uuid4().hex,
        }
        command = [
            str(Path(sys.executable).with_name("gunicorn")),
            "console.wsgi:application",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            # gthread keeps a client's connection open between its requests (the sync worker
            # closes it after each one, and every request paid a new TCP connection).
            "--worker-class",
            {"gthread": "gthread", "production": "console.serving.ThreadWorker", "sync": "sync"}.get(server, ""),
            "--threads",
            "16" if server == "production" else "1",
            "--keep-alive",
            "75",
            "--log-level",
            "warning",
        ]
        if server == "uvicorn":
            command = [
                str(Path(sys.executable).with_name("uvicorn")),
                "console.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--timeout-keep-alive",
                "75",
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        # Its log lines (one JSON line per request) go to a file, as to a log collector: a pipe
        # nobody reads would fill and block every worker.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self.process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                output = self.log.read().decode(errors="replace")
                raise RuntimeError(f"gunicorn exited: {output[-500:]}")
            try:
                answered = requests.get(self.url + "/api/v1/openapi.json", timeout=2).status_code == 200
                if answered and len(children_of(self.process.pid)) >= self.workers:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError("gunicorn did not answer within 60 s")

    def cpu_s(self) -> float:
        return process_cpu_s([self.process.pid, *children_of(self.process.pid)])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()


FLOOR_PATH = "/healthz"  # no database, no authentication: what every request pays before its view
FLOOR_SECONDS = 3.0


def floor_client(url: str, seconds: float, results) -> None:
    """One client of :func:`floor_round`: ``FLOOR_PATH`` over one kept-alive connection."""
    import urllib3

    pool = urllib3.connection_from_url(url, maxsize=1)
    count, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        answer = pool.urlopen("GET", FLOOR_PATH, retries=False)
        if answer.status != 200:
            results.put(("error", f"{FLOOR_PATH} answered {answer.status}"))
            return
        count += 1
    results.put(("count", count))


def floor_round(server: Gunicorn, clients: int, seconds: float) -> tuple[float, float]:
    """The HTTP stack's own cost: ``clients`` processes send ``GET /healthz`` to ``server``
    for ``seconds``. Returns (requests/s, gunicorn CPU in µs per request)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=floor_client, args=(server.url, seconds, results)) for _ in range(clients)]
    cpu_before = server.cpu_s()
    for proc in procs:
        proc.start()
    answers = [results.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    cpu = server.cpu_s() - cpu_before
    errors = [text for kind, text in answers if kind == "error"]
    if errors:
        raise RuntimeError(errors[0])
    total = sum(count for _, count in answers)
    return total / seconds, 1e6 * cpu / max(total, 1)


def run_http(
    database_url: str, tokens: list[str], args, *, tool: tuple[str, str], say, percentile, stats, backends, cpu
) -> dict:
    """The HTTP phase; ``stats``/``backends``/``cpu`` are the plain phase's meters."""
    n = len(tokens)
    server = Gunicorn(database_url, args.http_workers, getattr(args, "http_server", "gthread"))
    try:
        server.wait_ready()
        say(
            f"[http] {server.server} server with {args.http_workers} workers at {server.url}; starting {n} client processes"
        )
        ctx = mp.get_context("spawn")
        counters = ctx.Array("q", n, lock=False)
        ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        start_at = ctx.Value("d", 0.0, lock=False)
        key_prefix = uuid.uuid4().hex
        shared = (args.ops_per_lease, args.seconds, key_prefix, counters, ready, go, start_at, results, tool)
        procs = [
            ctx.Process(target=client_main, args=(i, server.url, tokens[i], *shared), name=f"bench-http-{i}")
            for i in range(n)
        ]
        for proc in procs:
            proc.start()
        for _ in range(n):
            message = ready.get(timeout=120)
            if message[0] == "error":
                raise RuntimeError(f"client {message[1]} failed during start-up: {message[2]}")
        before = stats.snapshot()
        backends.start()
        cpu_before, app_before = cpu(), server.cpu_s()
        say(f"[http] all {n} clients connected; measuring for {args.seconds:g} s")
        start_at.value = time.monotonic()
        go.set()
        collected: dict[int, dict] = {}
        next_report = start_at.value + 3
        while len(collected) < n:
            try:
                message = results.get(timeout=max(0.05, next_report - time.monotonic()))
            except queue.Empty:
                message = None
            if message is not None:
                if message[0] == "error":
                    raise RuntimeError(f"client {message[1]} failed: {message[2]}")
                collected[message[1]] = message[2]
            now = time.monotonic()
            if now >= next_report:
                elapsed, total = now - start_at.value, sum(counters[:])
                say(f"[http] {elapsed:5.1f} s elapsed: {total} transitions ({total / elapsed:,.0f}/s)")
                next_report += 3
            if now > start_at.value + args.seconds + 120:
                raise RuntimeError("clients did not finish within 120 s after the deadline")
        cpu_after, app_after = cpu(), server.cpu_s()
        for proc in procs:
            proc.join(timeout=30)
        server_cpu = backends.stop()
        after = stats.snapshot()
        # The same server, untimed by the phase: what a request costs it before any view.
        floor_rate, floor_us = floor_round(server, n, FLOOR_SECONDS)
        say(f"[http] floor: GET {FLOOR_PATH} {floor_rate:,.0f}/s, {floor_us:,.0f} us of gunicorn CPU per request")
    finally:
        server.stop()
    elapsed = max(r["finished"] for r in collected.values()) - start_at.value
    total = sum(r["count"] for r in collected.values())
    every = sorted(x for r in collected.values() for values in r["latencies"].values() for x in values)
    by_kind = {}
    for kind in HTTP_KINDS:
        values = sorted(x for r in collected.values() for x in r["latencies"][kind])
        by_kind[kind] = {
            "count": len(values),
            "p50": percentile(values, 0.50),
            "p99": percentile(values, 0.99),
            "mean": statistics.fmean(values) if values else float("nan"),
            "statements": None,
            "sql_share": None,
        }
    commits = wal = None
    if before and after:
        commits, wal = after[0] - before[0], after[1] - before[1]
    return {
        "mode": "http",
        "total": total,
        "statements": None,
        "elapsed": elapsed,
        "tps": total / elapsed,
        "runs": sum(r["runs"] for r in collected.values()),
        "p50": percentile(every, 0.50),
        "p99": percentile(every, 0.99),
        "by_kind": by_kind,
        "effects_per_s": by_kind["outcome"]["count"] / elapsed,
        "requests_per_effect": sum(by_kind[k]["count"] for k in HTTP_KINDS if k not in ("acquire", "release"))
        / max(1, by_kind["outcome"]["count"]),
        "client_cpu_s": sum(r["cpu_s"] for r in collected.values()),
        "client_sys_s": sum(r["sys_s"] for r in collected.values()),
        "client_preempted": sum(r["preempted"] for r in collected.values()),
        "app_cpu_s": app_after - app_before,
        "app_floor_us": floor_us,
        "server_cpu_s": server_cpu,
        "machine_busy_cores": (cpu_before, cpu_after),
        "commits": commits,
        "wal": wal,
    }
