"""Benchmark: fenced transitions per second as a ratio of pgbench TPS on the same server.

    python tests/bench/fenced_transitions.py [--workers N] [--seconds S] [--database-url URL]
    make bench BENCH_ARGS="--workers 4 --seconds 15"

A benchmark, not a test: pytest never collects this file (it does not start with test_).

Phase 1 (fenced): N worker processes, each with its own Worker identity and database
connection, loop for S seconds through the service layer:

    run_create -> lease_acquire
      -> (operation_intend -> operation_authorize -> operation_dispatch
          -> operation_report_outcome(CONFIRMED)) x 20 (--ops-per-lease)
    -> lease_release -> next run

Every successful state-changing service call (acquire, intend, authorize, dispatch,
outcome, release) counts as one fenced transition; run_create is setup and is not
counted (its time is inside the elapsed time all the same). Fenced transitions per
second = total count / elapsed wall time of the phase.

Phase 2 (pgbench): ``pgbench -b tpcb-like -c N -j min(2, N) -T S`` over TCP against a
separate database (``fenceline_pgbench``, initialised with ``pgbench -i -s 10`` once per
run, right before its phase). The two phases run one after the other, never at the same
time; a CHECKPOINT precedes the fenced phase.

The data lives in a dedicated database (``fenceline_bench`` by default), dropped and
recreated and migrated at the start of every run, so that runs are comparable and the
schema is the one of the migrations in the working tree. No other database is created,
changed or dropped.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import queue
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
KINDS = ("acquire", "intend", "authorize", "dispatch", "outcome", "release")
TENANT_SLUG = "bench"
LEASE_TTL_S = 600
PROGRESS_EVERY_S = 3.0
BENCH_DB = "fenceline_bench"  # dropped and recreated by every run; no other database is dropped
PGBENCH_DB = "fenceline_pgbench"  # created if missing; pgbench -i rebuilds its tables
WARMUP_RUNS = 3


class BenchError(Exception):
    """A reason to stop, printed as one line."""


# --- connection parameters ------------------------------------------------------------


class Server:
    """The PostgreSQL server named by the URL, and URLs/parameters for its databases."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
            raise BenchError(f"--database-url must be a postgres:// URL, got scheme {parts.scheme or '(none)'!r}")
        self.parts = parts
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 5432
        self.user = unquote(parts.username) if parts.username else "postgres"
        self.password = unquote(parts.password) if parts.password else None
        self.url_database = unquote(parts.path.lstrip("/")) or "postgres"

    def url_for(self, database: str) -> str:
        return urlunsplit(self.parts._replace(path="/" + database))

    def connect(self, database: str):
        import psycopg

        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=database,
            autocommit=True,
            connect_timeout=5,
        )

    def connect_admin(self):
        """A connection for CREATE DATABASE: the 'postgres' database, else the URL's."""
        import psycopg

        last = None
        for database in dict.fromkeys(["postgres", self.url_database, "template1"]):
            try:
                return self.connect(database)
            except psycopg.OperationalError as exc:
                last = exc
        reason = str(last).strip().splitlines()[0].strip() if last else "unknown error"
        raise BenchError(f"PostgreSQL is not available at {self.host}:{self.port} as {self.user}: {reason}")

    def pg_env(self) -> dict:
        env = dict(os.environ)
        if self.password:
            env["PGPASSWORD"] = self.password
        return env

    def pg_args(self, database: str) -> list[str]:
        return ["-h", self.host, "-p", str(self.port), "-U", self.user, database]


def recreate_database(server: Server, name: str) -> None:
    """Drop (if present) and create the benchmark's own database ``name``."""
    from psycopg import sql

    if name != BENCH_DB:
        raise BenchError(f"refusing to drop database {name!r}: only {BENCH_DB} is recreated")
    with server.connect_admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def ensure_database(server: Server, name: str) -> bool:
    """Create database ``name`` if it does not exist. Returns True if it was created."""
    from psycopg import sql

    with server.connect_admin() as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return True


class ServerStats:
    """Commits and WAL written in one database over a phase (pg_stat_database is flushed
    by each backend when it goes idle or exits; read after the workers are gone)."""

    def __init__(self, server: Server, database: str) -> None:
        self.server, self.database = server, database

    def snapshot(self) -> tuple[int, int] | None:
        try:
            with self.server.connect(self.database) as conn:
                conn.execute("SELECT pg_stat_force_next_flush()")
                commits = conn.execute(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                ).fetchone()[0]
                lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
                return int(commits), int(lsn)
        except Exception:
            return None


def checkpoint(server: Server, database: str) -> None:
    """Start the fenced phase with no dirty buffers left over from the setup (superuser only)."""
    try:
        with server.connect(database) as conn:
            conn.execute("CHECKPOINT")
    except Exception:
        pass


class BackendCpu:
    """CPU seconds used by the PostgreSQL backends serving one database, when the server
    runs on this machine: a thread samples /proc every SAMPLE_S and keeps, per backend,
    the last reading (a backend that exits loses at most its last SAMPLE_S)."""

    SAMPLE_S = 0.2

    def __init__(self, database: str) -> None:
        self.marker = f" {database} "
        self.tick = os.sysconf("SC_CLK_TCK")
        self.baseline: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.available = Path("/proc/self/stat").exists()
        self._stop = None
        self._thread = None

    def _scan(self) -> dict[int, float]:
        found = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
                if not cmdline.startswith("postgres:") or self.marker not in cmdline + " ":
                    continue
                with open(f"/proc/{entry.name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, ValueError, IndexError):
                continue
        return found

    def start(self) -> None:
        import threading

        if not self.available:
            return
        self.baseline = self._scan()
        self.last = dict(self.baseline)
        self._stop = threading.Event()

        def run():
            while not self._stop.wait(self.SAMPLE_S):
                self.last.update(self._scan())

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """CPU seconds of the database's backends since start(), or None off this machine."""
        if not self._thread:
            return None
        self._stop.set()
        self._thread.join()
        self.last.update(self._scan())
        used = sum(value - self.baseline.get(pid, 0.0) for pid, value in self.last.items())
        return used if self.last else None


def cpu_busy() -> tuple[float, float, float] | None:
    """(busy, steal, total) jiffies of the whole machine, from /proc/stat. Busy is user,
    nice, system, irq, softirq (guest time is already inside user); steal is time the
    hypervisor gave to someone else."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    fields += [0.0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def cpu_busy_cores(before, after, which: int = 0) -> float | None:
    if not before or not after or after[2] <= before[2]:
        return None
    return (after[which] - before[which]) / (after[2] - before[2]) * (os.cpu_count() or 1)


# --- the fenced phase: worker processes -------------------------------------------------


def django_setup(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DJANGO_DEBUG"] = "0"  # no query log in memory
    import django

    django.setup()


class SqlMeter:
    """Counts statements and the wall time spent inside cursor.execute (round trip plus
    server work). BEGIN/COMMIT are sent by psycopg outside cursor.execute and are not in it."""

    def __init__(self) -> None:
        self.statements = 0
        self.seconds = 0.0

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.statements += 1


def fenced_cycles(worker, index, key_prefix, ops_per_lease, call, stop, created_run=None) -> None:
    """The fenced cycle, until ``stop()``: a fresh run and its lease, ``ops_per_lease``
    operations intend -> authorize -> dispatch -> outcome(CONFIRMED), release. ``call(kind,
    fn, **kwargs)`` makes each counted service call; ``stop`` is checked before each."""
    from ledger.services.leases import lease_acquire, lease_release
    from ledger.services.operations import (
        Intent,
        operation_authorize,
        operation_dispatch,
        operation_intend,
        operation_report_outcome,
    )
    from ledger.services.runs import run_create
    from ledger.states import EffectClass, Outcome
    from ledger.versioning import CURRENT_SCHEMA_VERSION

    owner = f"bench-owner-{index}"
    seq = 0
    while not stop():
        run, _ = run_create(worker=worker, schema_version=CURRENT_SCHEMA_VERSION)
        if created_run is not None:
            created_run()
        if stop():
            return
        lease = call("acquire", lease_acquire, worker=worker, run_id=run.pk, owner_id=owner, ttl_s=LEASE_TTL_S)
        token = lease.fencing_token
        for _ in range(ops_per_lease):
            seq += 1
            intent = Intent(
                tool="bench",
                action="noop",
                resource=f"bench://{index}/{seq}",
                effect_class=EffectClass.IDEMPOTENT,
                idempotency_key=f"{key_prefix}-{index}-{seq}",
            )
            if stop():
                return
            op, created = call("intend", operation_intend, worker=worker, run_id=run.pk, fencing_token=token, intent=intent)
            if not created:
                raise RuntimeError(f"idempotency key {intent.idempotency_key} was not fresh")
            for kind, fn, extra in (
                ("authorize", operation_authorize, {}),
                ("dispatch", operation_dispatch, {}),
                ("outcome", operation_report_outcome, {"outcome": Outcome.CONFIRMED}),
            ):
                if stop():
                    return
                call(kind, fn, worker=worker, operation_id=op.pk, fencing_token=token, **extra)
        if stop():
            return
        call("release", lease_release, worker=worker, run_id=run.pk, owner_id=owner, fencing_token=token)


def worker_main(
    index, database_url, worker_pk, ops_per_lease, seconds, key_prefix, counters, ready, go, start_at, results, profile
):
    """One benchmark process. Reports ("ready", i), then ("result", i, {...}) or ("error", i, text)."""
    try:
        django_setup(database_url)
        from django.db import connection

        from ledger.models import Worker

        worker = Worker.objects.select_related("tenant").get(pk=worker_pk)
        connection.ensure_connection()
        latencies = {kind: [] for kind in KINDS}
        sql_by_kind = {kind: [0, 0.0] for kind in KINDS}
        meter = SqlMeter()
        count = 0
        runs = 0
        ready.put(("ready", index))
        go.wait()
        deadline = start_at.value + seconds
        perf = time.perf_counter

        def call(kind, fn, **kwargs):
            nonlocal count
            statements, sql_s = meter.statements, meter.seconds
            started = perf()
            value = fn(**kwargs)
            latencies[kind].append(perf() - started)
            sql_by_kind[kind][0] += meter.statements - statements
            sql_by_kind[kind][1] += meter.seconds - sql_s
            count += 1
            counters[index] = count
            return value

        def loop():
            nonlocal runs

            def stop() -> bool:
                return time.monotonic() >= deadline

            def created_run() -> None:
                nonlocal runs
                runs += 1

            fenced_cycles(worker, index, key_prefix, ops_per_lease, call, stop, created_run)

        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        with connection.execute_wrapper(meter):
            if profile and index == 0:
                import cProfile

                profiler = cProfile.Profile()
                profiler.runcall(loop)
                profiler.dump_stats(profile)
            else:
                loop()
        finished = time.monotonic()
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        connection.close()
        results.put(
            (
                "result",
                index,
                {
                    "count": count,
                    "runs": runs,
                    "finished": finished,
                    "latencies": latencies,
                    "sql_by_kind": sql_by_kind,
                    "cpu_s": (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime),
                    "sys_s": cpu_after.ru_stime - cpu_before.ru_stime,
                    "preempted": cpu_after.ru_nivcsw - cpu_before.ru_nivcsw,
                },
            )
        )
    except BaseException as exc:  # reported to the parent, which fails the run
        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if "does not exist" in line:
            line += " (models and migrations differ: were they edited after the migrate step?)"
        try:
            ready.put(("error", index, line))
            results.put(("error", index, line))
        finally:
            sys.exit(1)


# --- the parent -----------------------------------------------------------------------


def say(line: str = "") -> None:
    print(line, flush=True)


def prepare_fenced_db(server: Server, database: str, workers: int, *, analyze: bool) -> list[int]:
    """Recreate and migrate the benchmark database (every run starts from empty tables and
    from the migrations as they are in the working tree), make the worker identities, warm
    up with a few unmeasured cycles and ANALYZE the tables, so that the planner has
    statistics (with autovacuum off, as on these machines, it would never get any)."""
    recreate_database(server, database)
    say(f"[setup] database {database}: recreated; running migrations")
    django_setup(server.url_for(database))
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    if connection.vendor != "postgresql" or connection.settings_dict["NAME"] != database:
        raise BenchError(f"Django is not connected to PostgreSQL database {database}")
    from ledger.services.workers import tenant_ensure, worker_create

    tenant, _ = tenant_ensure(slug=TENANT_SLUG)
    stamp = uuid.uuid4().hex[:8]
    pks = [worker_create(tenant=tenant, name=f"bench-{stamp}-{i}")[0].pk for i in range(workers)]
    say(f"[setup] migrated; created tenant {TENANT_SLUG!r} and {workers} worker identities")
    from django.apps import apps

    from ledger.models import Worker

    warm_worker = Worker.objects.select_related("tenant").get(pk=pks[0])
    calls = {"n": 0}
    per_run = 2 + 4 * 20  # acquire, 20 x (intend, authorize, dispatch, outcome), release

    def plain_call(kind, fn, **kwargs):
        calls["n"] += 1
        return fn(**kwargs)

    fenced_cycles(warm_worker, "warmup", uuid.uuid4().hex, 20, plain_call, lambda: calls["n"] >= WARMUP_RUNS * per_run)
    if analyze:
        tables = [
            model._meta.db_table
            for label in ("ledger", "approvals")
            for model in apps.get_app_config(label).get_models()
            if model._meta.managed and not model._meta.proxy
        ]
        with connection.cursor() as cursor:
            for table in tables:
                cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
    say(f"[setup] warm-up: {WARMUP_RUNS} runs x 20 operations, unmeasured; {'ANALYZE done' if analyze else 'no ANALYZE'}")
    connection.close()
    return pks


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def run_fenced(server: Server, database: str, worker_pks: list[int], args) -> dict:
    ctx = mp.get_context("spawn")
    n = args.workers
    counters = ctx.Array("q", n, lock=False)
    ready = ctx.Queue()
    results = ctx.Queue()
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0, lock=False)
    key_prefix = uuid.uuid4().hex
    url = server.url_for(database)
    procs = [
        ctx.Process(
            target=worker_main,
            args=(
                i, url, worker_pks[i], args.ops_per_lease, args.seconds, key_prefix,
                counters, ready, go, start_at, results, args.profile,
            ),  # fmt: skip
            name=f"bench-worker-{i}",
        )
        for i in range(n)
    ]
    say(f"[fenced] starting {n} worker processes")
    for proc in procs:
        proc.start()
    try:
        for _ in range(n):
            try:
                message = ready.get(timeout=120)
            except queue.Empty:
                raise BenchError("the worker processes did not connect within 120 s") from None
            if message[0] == "error":
                raise BenchError(f"worker {message[1]} failed during start-up: {message[2]}")
        stats = ServerStats(server, database)
        checkpoint(server, database)
        before = stats.snapshot()
        backends = BackendCpu(database)
        backends.start()
        cpu_before = cpu_busy()
        say(f"[fenced] all {n} workers connected; measuring for {args.seconds:g} s")
        start_at.value = time.monotonic()
        go.set()
        collected: dict[int, dict] = {}
        next_report = start_at.value + PROGRESS_EVERY_S
        while len(collected) < n:
            try:
                message = results.get(timeout=max(0.05, next_report - time.monotonic()))
            except Exception:
                message = None
            if message is not None:
                if message[0] == "error":
                    raise BenchError(f"worker {message[1]} failed: {message[2]}")
                collected[message[1]] = message[2]
            now = time.monotonic()
            if now >= next_report:
                elapsed = now - start_at.value
                total = sum(counters[:])
                left = max(0.0, args.seconds - elapsed)
                say(f"[fenced] {elapsed:5.1f} s elapsed, {left:4.1f} s left: {total} transitions ({total / elapsed:,.0f}/s)")
                next_report += PROGRESS_EVERY_S
            if now > start_at.value + args.seconds + 120:
                raise BenchError("workers did not finish within 120 s after the deadline")
            if message is None and not any(p.is_alive() for p in procs) and len(collected) < n:
                try:
                    message = results.get(timeout=1)
                except Exception:
                    raise BenchError("a worker process exited without reporting") from None
                if message[0] == "error":
                    raise BenchError(f"worker {message[1]} failed: {message[2]}")
                collected[message[1]] = message[2]
        cpu_after = cpu_busy()
        for proc in procs:
            proc.join(timeout=30)
        server_cpu = backends.stop()
        after = stats.snapshot()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    elapsed = max(r["finished"] for r in collected.values()) - start_at.value
    total = sum(r["count"] for r in collected.values())
    all_latencies = sorted(x for r in collected.values() for values in r["latencies"].values() for x in values)
    by_kind = {}
    for kind in KINDS:
        values = sorted(x for r in collected.values() for x in r["latencies"][kind])
        statements = sum(r["sql_by_kind"][kind][0] for r in collected.values())
        sql_s = sum(r["sql_by_kind"][kind][1] for r in collected.values())
        by_kind[kind] = {
            "count": len(values),
            "p50": percentile(values, 0.50),
            "p99": percentile(values, 0.99),
            "mean": statistics.fmean(values) if values else float("nan"),
            "statements": statements / len(values) if values else float("nan"),
            "sql_share": sql_s / sum(values) if values else float("nan"),
        }
    commits = wal = None
    if before and after:
        commits, wal = after[0] - before[0], after[1] - before[1]
    return {
        "total": total,
        "elapsed": elapsed,
        "tps": total / elapsed,
        "runs": sum(r["runs"] for r in collected.values()),
        "p50": percentile(all_latencies, 0.50),
        "p99": percentile(all_latencies, 0.99),
        "by_kind": by_kind,
        "client_cpu_s": sum(r["cpu_s"] for r in collected.values()),
        "client_sys_s": sum(r["sys_s"] for r in collected.values()),
        "client_preempted": sum(r["preempted"] for r in collected.values()),
        "server_cpu_s": server_cpu,
        "machine_busy_cores": cpu_busy_cores(cpu_before, cpu_after),
        "steal_cores": cpu_busy_cores(cpu_before, cpu_after, 1),
        "commits": commits,
        "wal": wal,
    }


def prepare_pgbench(server: Server, database: str, pgbench: str, scale: int) -> None:
    created = ensure_database(server, database)
    say(f"[setup] database {database}: {'created' if created else 'exists'}; pgbench -i -s {scale} (a few seconds)")
    proc = subprocess.run(
        [pgbench, "-i", "-q", "-s", str(scale), *server.pg_args(database)],
        env=server.pg_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise BenchError(f"pgbench -i failed: {lines[-1] if lines else 'exit code ' + str(proc.returncode)}")


def run_pgbench(server: Server, database: str, pgbench: str, args) -> dict:
    threads = min(2, args.workers)
    command = [
        pgbench, "-b", "tpcb-like", "-c", str(args.workers), "-j", str(threads), "-T", str(int(args.seconds)),
        "-P", str(int(PROGRESS_EVERY_S)), *server.pg_args(database),
    ]  # fmt: skip
    stats = ServerStats(server, database)
    before = stats.snapshot()
    backends = BackendCpu(database)
    backends.start()
    cpu_before = cpu_busy()
    rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    say(f"[pgbench] {' '.join(command[:command.index('-h')])} -h {server.host} ... {database}")
    proc = subprocess.Popen(command, env=server.pg_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in proc.stdout:
        output.append(line.rstrip())
        if line.startswith("progress:"):
            say(f"[pgbench] {line.strip()}")
    proc.wait()
    cpu_after = cpu_busy()
    rusage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu = backends.stop()
    after = stats.snapshot()
    text = "\n".join(output)
    if proc.returncode != 0:
        raise BenchError(f"pgbench failed: {output[-1] if output else 'exit code ' + str(proc.returncode)}")
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    if not tps:
        raise BenchError("pgbench output has no 'tps = ... (without initial connection time)' line")
    latency = re.search(r"latency average = ([0-9.]+) ms", text)
    processed = re.search(r"number of transactions actually processed: (\d+)", text)
    cpu_s = (rusage_after.ru_utime - rusage_before.ru_utime) + (rusage_after.ru_stime - rusage_before.ru_stime)
    sys_s = rusage_after.ru_stime - rusage_before.ru_stime
    preempted = rusage_after.ru_nivcsw - rusage_before.ru_nivcsw
    commits = wal = None
    if before and after:
        commits, wal = after[0] - before[0], after[1] - before[1]
    return {
        "tps": float(tps.group(1)),
        "latency_ms": float(latency.group(1)) if latency else float("nan"),
        "transactions": int(processed.group(1)) if processed else None,
        "elapsed": args.seconds,
        "client_cpu_s": cpu_s,
        "client_sys_s": sys_s,
        "client_preempted": preempted,
        "server_cpu_s": server_cpu,
        "machine_busy_cores": cpu_busy_cores(cpu_before, cpu_after),
        "steal_cores": cpu_busy_cores(cpu_before, cpu_after, 1),
        "commits": commits,
        "wal": wal,
    }


def machine_context(server: Server) -> dict:
    with server.connect_admin() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections", "autovacuum")
        }
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", "ledger", "approvals"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        code = f"{head}{' + uncommitted changes in ledger/ or approvals/' if dirty else ''}" if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        code = "unknown"
    return {
        "code": code,
        "cores": os.cpu_count(),
        "cpu_model": model,
        "postgresql": version,
        "pg_settings": settings,
        "python": platform.python_version(),
        "load": os.getloadavg(),
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def per(value, count) -> str:
    if value is None or not count:
        return "n/a"
    return f"{value / count:.2f}"


def report(context: dict, args, fenced: dict, pg: dict) -> None:
    import django

    ratio = fenced["tps"] / pg["tps"] if pg["tps"] else float("nan")
    say()
    say("=" * 72)
    say(f"Fenceline fenced-transition benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    say(
        f"machine: {context['cores']} cores ({context['cpu_model'] or 'unknown CPU'}); "
        f"load average at start {context['load'][0]:.2f} / {context['load'][1]:.2f} / {context['load'][2]:.2f}"
    )
    pgs = context["pg_settings"]
    say(
        f"PostgreSQL {context['postgresql']} (synchronous_commit={pgs['synchronous_commit']}, fsync={pgs['fsync']}, "
        f"shared_buffers={pgs['shared_buffers']}, autovacuum={pgs['autovacuum']}); Python {context['python']}, Django {django.get_version()}"
    )
    say(f"code: git {context['code']}")
    say(f"N = {args.workers} processes/clients, S = {args.seconds:g} s per phase, {args.ops_per_lease} operations per lease")
    say("-" * 72)
    say(f"{'':34}{'fenced':>18}{'pgbench':>18}")
    say(f"{'transactions/s (fenced: transitions)':34}{fenced['tps']:>18,.1f}{pg['tps']:>18,.1f}")
    say(f"{'ratio fenced / pgbench':34}{ratio:>18.3f}")
    say(f"{'latency p50':34}{ms(fenced['p50']):>18}{'':>18}")
    say(f"{'latency p99':34}{ms(fenced['p99']):>18}{'':>18}")
    say(f"{'mean latency (N / rate)':34}{ms(fenced['elapsed'] * args.workers / max(1, fenced['total'])):>18}{pg['latency_ms']:>15.2f} ms")
    say(f"{'count':34}{fenced['total']:>18,}{(pg['transactions'] or 0):>18,}")
    say(f"{'server commits per transition':34}{per(fenced['commits'], fenced['total']):>18}{per(pg['commits'], pg['transactions']):>18}")
    wal_f = f"{fenced['wal'] / fenced['total']:,.0f} B" if fenced["wal"] is not None and fenced["total"] else "n/a"
    wal_p = f"{pg['wal'] / pg['transactions']:,.0f} B" if pg["wal"] is not None and pg["transactions"] else "n/a"
    say(f"{'WAL per transition':34}{wal_f:>18}{wal_p:>18}")
    counts = {"f": fenced["total"], "p": pg["transactions"]}
    phases = {"f": fenced, "p": pg}

    def row(label, value):
        cells = []
        for key in ("f", "p"):
            text = value(phases[key], counts[key])
            cells.append(text if text is not None else "n/a")
        say(f"{label:34}{cells[0]:>18}{cells[1]:>18}")

    def cores(name):
        return lambda ph, n: f"{ph[name] / ph['elapsed']:.2f}" if ph.get(name) is not None else None

    def cpu_per(name):
        return lambda ph, n: f"{ph[name] / n * 1e6:,.0f} us" if ph.get(name) is not None and n else None

    def rest(ph, n):
        if ph.get("machine_busy_cores") is None or ph.get("client_cpu_s") is None or ph.get("server_cpu_s") is None:
            return None
        return f"{ph['machine_busy_cores'] - (ph['client_cpu_s'] + ph['server_cpu_s']) / ph['elapsed']:.2f}"

    row("client CPU (cores busy)", cores("client_cpu_s"))
    row("server backends CPU (cores busy)", cores("server_cpu_s"))
    row("rest of machine (cores busy)", rest)
    row("whole machine (cores busy)", lambda ph, n: f"{ph['machine_busy_cores']:.2f}" if ph.get("machine_busy_cores") is not None else None)
    row("hypervisor steal (cores)", lambda ph, n: f"{ph['steal_cores']:.2f}" if ph.get("steal_cores") is not None else None)
    row("client CPU per transition", cpu_per("client_cpu_s"))
    row("  of which kernel (sys)", cpu_per("client_sys_s"))
    row("server backend CPU per transition", cpu_per("server_cpu_s"))
    row(
        "client preemptions per transition",
        lambda ph, n: f"{ph['client_preempted'] / n:.2f}" if ph.get("client_preempted") is not None and n else None,
    )
    say("-" * 72)
    say(f"{'fenced, per transition kind':18}{'count':>9}{'p50':>11}{'p99':>11}{'SQL stmts':>11}{'in execute':>12}")
    for kind in KINDS:
        k = fenced["by_kind"][kind]
        say(
            f"{kind:18}{k['count']:>9,}{ms(k['p50']):>11}{ms(k['p99']):>11}"
            f"{k['statements']:>11.1f}{k['sql_share'] * 100:>11.0f}%"
        )
    say(f"(+ {fenced['runs']:,} run_create calls, not counted; 'in execute' = share of the call's wall time spent")
    say(" inside cursor.execute, i.e. round trip + server work; BEGIN/COMMIT are outside it;")
    say(" 'rest of machine' = other processes, PostgreSQL's WAL writer/checkpointer, kernel)")
    say("=" * 72)
    if args.profile:
        import pstats

        say(f"cProfile of worker 0 written to {args.profile}; top functions by internal time:")
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", "-n", type=int, default=4, help="worker processes and pgbench clients (default 4)")
    parser.add_argument("--seconds", "-s", type=int, default=15, help="duration of each phase (default 15)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_URL,
        help="any database on the PostgreSQL server to use (default $DATABASE_URL or %(default)s); "
        "the benchmark uses its own databases on that server",
    )
    parser.add_argument("--scale", type=int, default=10, help="pgbench -i scale factor (default %(default)s)")
    parser.add_argument("--ops-per-lease", type=int, default=20, help="operations per lease before release (default 20)")
    parser.add_argument(
        "--pgbench",
        default=shutil.which("pgbench") or "/usr/bin/pgbench",
        help="pgbench executable (default %(default)s)",
    )
    parser.add_argument(
        "--no-analyze", action="store_true", help="skip ANALYZE after the warm-up (planner without statistics)"
    )
    parser.add_argument("--skip-pgbench", action="store_true", help="fenced phase only (no ratio)")
    parser.add_argument("--profile", metavar="FILE", help="run worker 0 under cProfile and write its stats to FILE")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.seconds < 1 or args.ops_per_lease < 1:
        parser.error("--workers, --seconds and --ops-per-lease must be at least 1")
    if args.profile:
        args.profile = str(Path(args.profile).resolve())

    try:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise BenchError("psycopg is not installed in this interpreter; use .venv/bin/python") from None
        server = Server(args.database_url)
        pgbench = shutil.which(args.pgbench)
        if not args.skip_pgbench and not pgbench:
            raise BenchError(f"pgbench not found ({args.pgbench!r}); install postgresql-client or pass --pgbench PATH")
        context = machine_context(server)  # fails here, with the reason, if PostgreSQL is down
        say(
            f"[setup] {context['cores']} cores, load average {context['load'][0]:.2f}; PostgreSQL "
            f"{context['postgresql']} at {server.host}:{server.port}; N={args.workers}, S={args.seconds:g}"
        )
        worker_pks = prepare_fenced_db(server, BENCH_DB, args.workers, analyze=not args.no_analyze)
        fenced = run_fenced(server, BENCH_DB, worker_pks, args)
        say(f"[fenced] done: {fenced['total']:,} transitions in {fenced['elapsed']:.1f} s = {fenced['tps']:,.1f}/s")
        if args.skip_pgbench:
            pg = {"tps": float("nan"), "latency_ms": float("nan"), "transactions": None, "elapsed": args.seconds,
                  "client_cpu_s": None, "server_cpu_s": None, "machine_busy_cores": None, "steal_cores": None, "commits": None,
                  "wal": None}  # fmt: skip
        else:
            # Initialised right before its run, as in the usual `pgbench -i; pgbench` (and the
            # SETUP-NOTES reference): its pages are newer than the last checkpoint, so the run
            # pays no full-page writes for them.
            prepare_pgbench(server, PGBENCH_DB, pgbench, args.scale)
            pg = run_pgbench(server, PGBENCH_DB, pgbench, args)
            say(f"[pgbench] done: {pg['tps']:,.1f} TPS")
        report(context, args, fenced, pg)
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("bench failed: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        print(f"bench failed: {first}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
