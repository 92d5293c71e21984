"""Benchmark: fenced transitions per second as a ratio of pgbench TPS on the same server.

    python tests/bench/fenced_transitions.py [--mode both|plain|authority] [--workers N] [--seconds S]
    make bench BENCH_ARGS="--workers 4 --seconds 15"

A benchmark, not a test: pytest never collects this file (it does not start with test_).
By default one invocation runs three phases back to back: fenced (plain), fenced
(authority), pgbench. ``--mode plain`` / ``--mode authority`` (or ``--authority``) runs
only one fenced phase.

Fenced phase, plain mode: N worker processes, each with its own Worker identity and database
connection, loop for S seconds through the service layer:

    run_create -> lease_acquire
      -> (operation_intend -> operation_authorize -> operation_dispatch
          -> operation_report_outcome(CONFIRMED)) x 20 (--ops-per-lease)
    -> lease_release -> next run

Every successful state-changing service call (acquire, intend, authorize, dispatch,
outcome, release) counts as one fenced transition; run_create is setup and is not
counted (its time is inside the elapsed time all the same). Fenced transitions per
second = total count / elapsed wall time of the phase.

Fenced phase, authority mode: the same loop under a tenant policy that requires a
credential lease and a capability and limits cost (run, tenant and provider limits of
10^12 cents, never reached), with one credential (``credential_create``) made at setup.
After lease_acquire each run issues one credential lease (``credential_lease_issue``) and
requests one capability (``capability_request``, max_calls = operations per lease), both
scoped to exactly the run's operation resources and both counted as fenced transitions.
Each intent carries a provider and ``estimated_cost_cents``; authorize names the credential
lease; dispatch re-checks everything and reserves one capability call and the estimate on
the run, tenant and provider budgets; outcome CONFIRMED reports ``actual_cost_cents``,
which settles the reservation.

pgbench phase: ``pgbench -b tpcb-like -c N -j min(2, N) -T S`` over TCP against a
separate database (``fenceline_pgbench``, initialised with ``pgbench -i -s 10`` once per
run, right before its phase). The two phases run one after the other, never at the same
time; a CHECKPOINT precedes each fenced phase.

The data lives in a dedicated database (``fenceline_bench``), dropped and recreated and
migrated before each fenced phase, so that phases and runs are comparable and the
schema is the one of the migrations in the working tree. No other database is created,
changed or dropped.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
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
KINDS = ("acquire", "credential", "capability", "intend", "authorize", "dispatch", "start", "outcome", "release")
# plain and authority: an effect as four calls (intend, authorize, dispatch, outcome); effects:
# as the clients make it, two (operation_start, the one call of POST /runs/{id}/effects, and
# the outcome), plain policy; http: the Python client against gunicorn, the one call too.
MODES = ("plain", "authority", "effects", "http")
MODE_SETS = {"all": MODES, "both": ("plain", "authority"), **{mode: (mode,) for mode in MODES}}
TENANT_SLUG = "bench"
LEASE_TTL_S = 600
PROGRESS_EVERY_S = 3.0
BENCH_DB = "fenceline_bench"  # dropped and recreated by every run; no other database is dropped
OWN_DATABASES = (BENCH_DB, "fenceline_bench_ledger")  # the benchmarks' own databases, and only them
PGBENCH_DB = "fenceline_pgbench"  # created if missing; pgbench -i rebuilds its tables
WARMUP_RUNS = 3

# Authority mode: the tenant's credential, the provider and costs of every operation.
AUTH_TOOL, AUTH_ACTION = "bench", "noop"
AUTH_PRINCIPAL = "bench-bot"
AUTH_SECRET_REF = "vault:kv/bench-bot"  # a reference only; there is no secret
AUTH_PROVIDER = "bench-llm"
AUTH_ESTIMATE_CENTS = 5
AUTH_ACTUAL_CENTS = 3
AUTH_LIMIT_CENTS = 10**12  # run, tenant and provider limits: never reached in a run
AUTH_MAX_OPS_PER_LEASE = 50  # a credential lease names at most 50 resources


def authority_policy(ops_per_lease: int) -> dict:
    """The tenant policy of authority mode: credential and capability required, cost limited."""
    return {
        "rules": [{"tool": AUTH_TOOL, "actions": [AUTH_ACTION], "resources": ["bench://*"]}],
        "require_credential": True,
        "require_capability": True,
        "max_ttl_s": 3600,
        "max_calls": max(100, ops_per_lease),
        "cost_limits_cents": {
            "run": AUTH_LIMIT_CENTS,
            "tenant": AUTH_LIMIT_CENTS,
            "retry": None,
            "provider": {AUTH_PROVIDER: AUTH_LIMIT_CENTS},
        },
    }


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

    if name not in OWN_DATABASES:
        raise BenchError(f"refusing to drop database {name!r}: only {', '.join(OWN_DATABASES)} are recreated")
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

    def wait_for_clients_gone(self, timeout_s: float = 10.0) -> None:
        """Wait until the phase's backends have exited: each flushes its counters as it exits,
        which on a busy machine can lag behind its client's exit. Polled from the admin
        database, so that the polling adds no commits to the one measured."""
        deadline = time.monotonic() + timeout_s
        try:
            with self.server.connect_admin() as conn:
                while time.monotonic() < deadline:
                    others = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [self.database]
                    ).fetchone()[0]
                    if not others:
                        break
                    time.sleep(0.05)
            time.sleep(0.2)  # a backend leaves pg_stat_activity just before its last flush
        except Exception:  # noqa: S110 - best effort: the figures are read either way
            pass

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
    except Exception:  # noqa: S110 - best effort: CHECKPOINT needs a superuser
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


def describe(exc: BaseException) -> str:
    """One line: the service call that raised (if known), the class, a domain code, the detail."""
    code = getattr(exc, "code", None)
    where = f"{exc.bench_call}() raised " if getattr(exc, "bench_call", None) else ""
    extra = getattr(exc, "extra", None)
    text = f"{where}{type(exc).__name__}{f' {code}' if isinstance(code, str) else ''}: {exc}"
    if extra:
        text += f" {extra}"
    return text.strip().splitlines()[0]


def django_setup(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DJANGO_DEBUG"] = "0"  # no query log in memory
    import django

    django.setup()


class SqlMeter:
    """Counts statements (and the wall time inside cursor.execute). BEGIN/COMMIT are sent by
    psycopg outside cursor.execute and are not in it. Installed only for the census cycle
    after the timed loop: an execute wrapper sends every statement through Django's cursor
    wrapper, which costs the client about as much CPU as the round trip itself
    (``ledger.sql.connection.execute``), so the timed loop runs without it."""

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


def fenced_cycles(
    worker, index, key_prefix, ops_per_lease, call, stop, created_run=None, authority=False, one_call=False
) -> None:
    """The fenced cycle, until ``stop()``: a fresh run and its lease, ``ops_per_lease``
    operations intend -> authorize -> dispatch -> outcome(CONFIRMED), release. ``call(kind,
    fn, **kwargs)`` makes each counted service call; ``stop`` is checked before each. With
    ``one_call``, intend, authorize and dispatch are one call (``operation_start``).
    With ``authority``, each run also takes a credential lease and a capability scoped to
    its operations' resources, and each operation carries a provider and a cost."""
    from ledger.services.authority.capabilities import capability_request
    from ledger.services.authority.credential_leases import credential_lease_issue
    from ledger.services.core.intent import Intent
    from ledger.services.fence.effects import operation_start
    from ledger.services.fence.leases import lease_acquire, lease_release
    from ledger.services.fence.operations import operation_authorize, operation_dispatch, operation_intend
    from ledger.services.fence.outcomes import operation_report_outcome
    from ledger.services.fence.runs import run_create
    from ledger.states import EffectClass, Outcome
    from ledger.versioning import CURRENT_SCHEMA_VERSION

    owner = f"bench-owner-{index}"
    cost = {"provider": AUTH_PROVIDER, "estimated_cost_cents": AUTH_ESTIMATE_CENTS} if authority else {}
    seq = 0
    while not stop():
        run, _ = run_create(worker=worker, schema_version=CURRENT_SCHEMA_VERSION)
        if created_run is not None:
            created_run()
        if stop():
            return
        lease = call("acquire", lease_acquire, worker=worker, run_id=run.pk, owner_id=owner, ttl_s=LEASE_TTL_S)
        token = lease.fencing_token
        authorize_extra, outcome_extra = {}, {"outcome": Outcome.CONFIRMED}
        if authority:
            resources = [f"bench://{index}/{n}" for n in range(seq + 1, seq + 1 + ops_per_lease)]
            scope = {"worker": worker, "run_id": run.pk, "fencing_token": token, "actions": [AUTH_ACTION]}
            if stop():
                return
            credential_lease = call(
                "credential",
                credential_lease_issue,
                **scope,
                principal=AUTH_PRINCIPAL,
                resources=resources,
                ttl_s=LEASE_TTL_S,
            )
            if stop():
                return
            call(
                "capability", capability_request, **scope, tool=AUTH_TOOL, resources=resources,
                max_calls=ops_per_lease, ttl_s=LEASE_TTL_S,
            )  # fmt: skip
            authorize_extra = {"credential_lease_id": credential_lease.pk}
            outcome_extra["actual_cost_cents"] = AUTH_ACTUAL_CENTS
        for _ in range(ops_per_lease):
            seq += 1
            intent = Intent(
                tool=AUTH_TOOL,
                action=AUTH_ACTION,
                resource=f"bench://{index}/{seq}",
                effect_class=EffectClass.IDEMPOTENT,
                idempotency_key=f"{key_prefix}-{index}-{seq}",
                **cost,
            )
            if stop():
                return
            if one_call:
                started = call(
                    "start", operation_start, worker=worker, run_id=run.pk, fencing_token=token, intent=intent
                )
                if not started.created or not started.dispatched:
                    raise RuntimeError(f"idempotency key {intent.idempotency_key}: {started.phase}, not dispatched")
                if stop():
                    return
                call(
                    "outcome", operation_report_outcome, worker=worker, operation_id=started.operation.pk,
                    fencing_token=token, **outcome_extra,
                )  # fmt: skip
                continue
            op, created = call(
                "intend", operation_intend, worker=worker, run_id=run.pk, fencing_token=token, intent=intent
            )
            if not created:
                raise RuntimeError(f"idempotency key {intent.idempotency_key} was not fresh")
            for kind, fn, extra in (
                ("authorize", operation_authorize, authorize_extra),
                ("dispatch", operation_dispatch, {}),
                ("outcome", operation_report_outcome, outcome_extra),
            ):
                if stop():
                    return
                call(kind, fn, worker=worker, operation_id=op.pk, fencing_token=token, **extra)
        if stop():
            return
        call("release", lease_release, worker=worker, run_id=run.pk, owner_id=owner, fencing_token=token)


def worker_main(
    index, database_url, worker_pk, ops_per_lease, seconds, key_prefix, counters, ready, go, start_at, results, profile,
    authority=False, one_call=False,
):  # fmt: skip
    """One benchmark process. Reports ("ready", i), then ("result", i, {...}) or ("error", i, text)."""
    try:
        django_setup(database_url)
        from django.db import connection

        from ledger.models import Worker

        worker = Worker.objects.select_related("tenant").get(pk=worker_pk)
        connection.ensure_connection()
        latencies = {kind: [] for kind in KINDS}
        sql_by_kind = {kind: [0, 0.0, 0] for kind in KINDS}  # statements, seconds, calls (census)
        meter = SqlMeter()
        count = 0
        runs = 0
        ready.put(("ready", index))
        go.wait()
        deadline = start_at.value + seconds
        perf = time.perf_counter

        def call(kind, fn, **kwargs):
            nonlocal count
            started = perf()
            try:
                value = fn(**kwargs)
            except Exception as exc:
                exc.bench_call = fn.__name__  # named in the error report
                raise
            latencies[kind].append(perf() - started)
            count += 3 if kind == "start" else 1  # the one call makes three transitions
            counters[index] = count
            return value

        def loop():
            nonlocal runs

            def stop() -> bool:
                return time.monotonic() >= deadline

            def created_run() -> None:
                nonlocal runs
                runs += 1

            fenced_cycles(worker, index, key_prefix, ops_per_lease, call, stop, created_run, authority, one_call)

        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        if profile and index == 0:
            import cProfile

            profiler = cProfile.Profile(time.process_time)  # CPU, not waiting
            profiler.runcall(loop)
            profiler.dump_stats(profile)
        else:
            loop()
        finished = time.monotonic()
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)

        # Census, after the clock stopped: one more cycle with every statement counted.
        census_done = False

        def census_call(kind, fn, **kwargs):
            nonlocal census_done
            statements, sql_s = meter.statements, meter.seconds
            value = fn(**kwargs)
            sql_by_kind[kind][0] += meter.statements - statements
            sql_by_kind[kind][1] += meter.seconds - sql_s
            sql_by_kind[kind][2] += 1
            census_done = census_done or kind == "release"
            return value

        with connection.execute_wrapper(meter):
            fenced_cycles(
                worker,
                index,
                f"{key_prefix}-census",
                ops_per_lease,
                census_call,
                lambda: census_done,
                None,
                authority,
                one_call,
            )
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
        line = describe(exc)
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


def prepare_fenced_db(
    server: Server, database: str, workers: int, *, analyze: bool, authority: bool = False, ops_per_lease: int = 20
) -> list[int]:
    """Recreate and migrate the benchmark database (every run starts from empty tables and
    from the migrations as they are in the working tree), make the worker identities (and,
    in authority mode, the tenant policy and credential), warm up with a few unmeasured
    cycles and ANALYZE the tables, so that the planner has statistics (with autovacuum off,
    as on these machines, it would never get any)."""
    recreate_database(server, database)
    say(f"[setup] database {database}: recreated; running migrations")
    django_setup(server.url_for(database))
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    if connection.settings_dict["NAME"] != database:
        raise BenchError(f"Django is not connected to PostgreSQL database {database}")
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    tenant, _ = tenant_ensure(slug=TENANT_SLUG)
    stamp = uuid.uuid4().hex[:8]
    pks = [worker_create(tenant=tenant, name=f"bench-{stamp}-{i}")[0].pk for i in range(workers)]
    say(f"[setup] migrated; created tenant {TENANT_SLUG!r} and {workers} worker identities")
    if authority:
        from ledger.services.authority.credentials import credential_create
        from ledger.services.authority.policy import policy_change

        version = policy_change(
            tenant=tenant, document=authority_policy(ops_per_lease), changed_by="bench", reason="authority benchmark"
        ).version
        credential_create(tenant=tenant, principal=AUTH_PRINCIPAL, secret_ref=AUTH_SECRET_REF)
        say(
            f"[setup] authority: policy v{version} (credential, capability, cost limits), credential {AUTH_PRINCIPAL!r}"
        )
    from django.apps import apps

    from ledger.models import Worker

    warm_worker = Worker.objects.select_related("tenant").get(pk=pks[0])
    calls = {"n": 0}
    # acquire, [credential, capability,] 20 x (intend, authorize, dispatch, outcome), release
    per_run = (4 if authority else 2) + 4 * 20

    def plain_call(kind, fn, **kwargs):
        calls["n"] += 1
        return fn(**kwargs)

    fenced_cycles(
        warm_worker, "warmup", uuid.uuid4().hex, 20, plain_call, lambda: calls["n"] >= WARMUP_RUNS * per_run,
        authority=authority,
    )  # fmt: skip
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
    say(
        f"[setup] warm-up: {WARMUP_RUNS} runs x 20 operations, unmeasured; {'ANALYZE done' if analyze else 'no ANALYZE'}"
    )
    connection.close()
    return pks


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def run_fenced(
    server: Server,
    database: str,
    worker_pks: list[int],
    args,
    *,
    authority: bool = False,
    one_call: bool = False,
    profile=None,
) -> dict:
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
                i,
                url,
                worker_pks[i],
                args.ops_per_lease,
                args.seconds,
                key_prefix,
                counters,
                ready,
                go,
                start_at,
                results,
                profile,
                authority,
                one_call,
            ),
            name=f"bench-worker-{i}",
        )
        for i in range(n)
    ]
    mode = "authority" if authority else "effects" if one_call else "plain"
    tag = f"[{mode}]"
    say(f"{tag} starting {n} worker processes")
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
        say(f"{tag} all {n} workers connected; measuring for {args.seconds:g} s")
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
                say(
                    f"{tag} {elapsed:5.1f} s elapsed, {left:4.1f} s left: {total} transitions ({total / elapsed:,.0f}/s)"
                )
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
        stats.wait_for_clients_gone()
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
        census_calls = sum(r["sql_by_kind"][kind][2] for r in collected.values())
        by_kind[kind] = {
            "count": len(values),
            "p50": percentile(values, 0.50),
            "p99": percentile(values, 0.99),
            "mean": statistics.fmean(values) if values else float("nan"),
            "statements": statements / census_calls if census_calls else float("nan"),
        }
    commits = wal = None
    if before and after:
        commits, wal = after[0] - before[0], after[1] - before[1]
    return {
        "mode": mode,
        "total": total,
        # Statements per counted call, from the census cycles, weighted by the timed calls.
        "statements": sum(k["statements"] * k["count"] for k in by_kind.values() if k["count"]),
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


def http_phase_run(server: Server, args) -> dict:
    """The plain cycle through the client over HTTP (tests/bench/http_phase.py)."""
    from tests.bench.http_phase import run_http

    pks = prepare_fenced_db(server, BENCH_DB, args.workers, analyze=not args.no_analyze)
    django_setup(server.url_for(BENCH_DB))
    from django.db import connection

    from ledger.models import Worker
    from ledger.services.fleet.workers import worker_rotate_token

    tokens = [worker_rotate_token(worker=Worker.objects.get(pk=pk)) for pk in pks]
    connection.close()
    checkpoint(server, BENCH_DB)
    phase = run_http(
        server.url_for(BENCH_DB), tokens, args, tool=(AUTH_TOOL, AUTH_ACTION), say=say, percentile=percentile,
        stats=ServerStats(server, BENCH_DB), backends=BackendCpu(BENCH_DB), cpu=cpu_busy,
    )  # fmt: skip
    before, after = phase["machine_busy_cores"]
    phase["machine_busy_cores"] = cpu_busy_cores(before, after)
    phase["steal_cores"] = cpu_busy_cores(before, after, 1)
    return phase


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
    say(f"[pgbench] {' '.join(command[: command.index('-h')])} -h {server.host} ... {database}")
    proc = subprocess.Popen(command, env=server.pg_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in proc.stdout:
        output.append(line.rstrip())
        if line.startswith("progress:"):
            say(f"[pgbench] {line.strip()}")
    proc.wait()
    cpu_after = cpu_busy()
    rusage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stats.wait_for_clients_gone()
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
            ["git", "-C", str(ROOT), "diff", "HEAD", "--", "ledger", "approvals"],
            capture_output=True,
            timeout=10,
        ).stdout
        # The digest tells runs on different uncommitted states of the code apart.
        changes = (
            f" + uncommitted changes in ledger/ or approvals/ (diff sha256 {hashlib.sha256(dirty).hexdigest()[:8]})"
        )
        code = f"{head}{changes if dirty.strip() else ''}" if head else "unknown"
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


def report(context: dict, args, fenced_phases: list[dict], pg: dict) -> None:
    import django

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
    say(
        f"N = {args.workers} processes/clients, S = {args.seconds:g} s per phase, {args.ops_per_lease} operations per lease"
    )
    say("-" * 72)
    pg = {**pg, "total": pg["transactions"]}
    phases = [*fenced_phases, pg]
    width = 16
    say(f"{'':34}" + "".join(f"{name:>{width}}" for name in [*(f["mode"] for f in fenced_phases), "pgbench"]))

    def row(label, value):
        cells = []
        for ph in phases:
            text = value(ph, ph["total"]) if ph is not pg or ph["total"] else None
            cells.append(text if text is not None else "")
        say(f"{label:34}" + "".join(f"{cell:>{width}}" for cell in cells))

    def fenced_only(value):
        return lambda ph, n: value(ph, n) if ph is not pg else None

    row("transactions/s (fenced: transitions)", lambda ph, n: f"{ph['tps']:,.1f}")
    row("ratio to pgbench", fenced_only(lambda ph, n: f"{ph['tps'] / pg['tps']:.3f}" if pg["tps"] else "n/a"))
    row("latency p50", fenced_only(lambda ph, n: ms(ph["p50"])))
    row("latency p99", fenced_only(lambda ph, n: ms(ph["p99"])))
    row(
        "mean latency (N / rate)",
        lambda ph, n: ms(ph["elapsed"] * args.workers / max(1, n)) if ph is not pg else f"{ph['latency_ms']:.2f} ms",
    )
    row("count", lambda ph, n: f"{n:,}")
    row(
        "SQL statements per transition",
        fenced_only(lambda ph, n: f"{ph['statements'] / n:.2f}" if n and ph["statements"] is not None else None),
    )
    row("server commits per transition", lambda ph, n: per(ph["commits"], n))
    row("WAL per transition", lambda ph, n: f"{ph['wal'] / n:,.0f} B" if ph["wal"] is not None and n else None)

    def cores(name):
        return lambda ph, n: f"{ph[name] / ph['elapsed']:.2f}" if ph.get(name) is not None else None

    def cpu_per(name):
        return lambda ph, n: f"{ph[name] / n * 1e6:,.0f} us" if ph.get(name) is not None and n else None

    def rest(ph, n):
        if ph.get("machine_busy_cores") is None or ph.get("client_cpu_s") is None or ph.get("server_cpu_s") is None:
            return None
        mine = ph["client_cpu_s"] + ph["server_cpu_s"] + (ph.get("app_cpu_s") or 0)
        return f"{ph['machine_busy_cores'] - mine / ph['elapsed']:.2f}"

    row("client CPU (cores busy)", cores("client_cpu_s"))
    row("app server CPU (gunicorn, cores busy)", cores("app_cpu_s"))
    row("server backends CPU (cores busy)", cores("server_cpu_s"))
    row("rest of machine (cores busy)", rest)
    row(
        "whole machine (cores busy)",
        lambda ph, n: f"{ph['machine_busy_cores']:.2f}" if ph.get("machine_busy_cores") is not None else None,
    )
    row(
        "hypervisor steal (cores)",
        lambda ph, n: f"{ph['steal_cores']:.2f}" if ph.get("steal_cores") is not None else None,
    )
    row("client CPU per transition", cpu_per("client_cpu_s"))
    row("  of which kernel (sys)", cpu_per("client_sys_s"))
    row("app server CPU per transition", cpu_per("app_cpu_s"))
    row(
        "  its floor: per request, no view",
        lambda ph, n: f"{ph['app_floor_us']:,.0f} us" if ph.get("app_floor_us") is not None else None,
    )
    row("server backend CPU per transition", cpu_per("server_cpu_s"))
    row(
        "client preemptions per transition",
        lambda ph, n: f"{ph['client_preempted'] / n:.2f}" if ph.get("client_preempted") is not None and n else None,
    )
    by_mode = {f["mode"]: f for f in fenced_phases}
    if by_mode.get("plain", {}).get("tps"):
        for mode in ("authority", "http"):
            if mode in by_mode:
                say(f"{mode} / plain transitions/s: {by_mode[mode]['tps'] / by_mode['plain']['tps']:.3f}")
    if "http" in by_mode:
        http = by_mode["http"]
        say(
            f"http effects/s: {http['effects_per_s']:,.1f} "
            f"({http['requests_per_effect']:.2f} requests per effect, not counting acquire and release)"
        )
    if "plain" in by_mode and "authority" in by_mode:
        plain_p50 = by_mode["plain"]["by_kind"]["dispatch"]["p50"]
        authority_p50 = by_mode["authority"]["by_kind"]["dispatch"]["p50"]
        if plain_p50:
            say(
                f"dispatch p50, authority / plain: {ms(authority_p50)} / {ms(plain_p50)} = "
                f"{authority_p50 / plain_p50:.2f} (a tenant-wide hot row would show here)"
            )
    report_peer(by_mode, pg.get("peer"))
    for fenced in fenced_phases:
        say("-" * 72)
        say(f"{fenced['mode'] + ', per kind':18}{'count':>9}{'p50':>11}{'p99':>11}{'SQL stmts':>11}")
        for kind, k in fenced["by_kind"].items():
            if not k["count"]:
                continue
            sql = "" if k["statements"] is None else f"{k['statements']:>11.1f}"
            say(f"{kind:18}{k['count']:>9,}{ms(k['p50']):>11}{ms(k['p99']):>11}{sql}")
        say(f"(+ {fenced['runs']:,} run_create calls, not counted)")
    say("'SQL stmts' = statements per call, counted in one untimed census cycle per worker after the")
    say(" timed loop; BEGIN/COMMIT are not in it; 'rest of machine' = other processes, PostgreSQL's")
    say(" WAL writer/checkpointer, kernel; 'its floor' = gunicorn's CPU per GET /healthz (no database,")
    say(" no authentication) from the same clients after the phase: what every request costs before its view")
    say("=" * 72)
    for fenced in fenced_phases:
        if fenced.get("profile"):
            import pstats

            say(
                f"cProfile of worker 0 ({fenced['mode']}) written to {fenced['profile']}; top functions by internal time:"
            )
            pstats.Stats(fenced["profile"]).sort_stats("tottime").print_stats(15)


def shorten_sql(sql: str) -> str:
    """One statement on one line, with long column and value lists elided."""
    sql = " ".join(sql.split())
    sql = re.sub(r"^SELECT (?:DISTINCT )?(.{50,}?) FROM ", "SELECT … FROM ", sql)
    sql = re.sub(r"^INSERT INTO (\S+) \(.*?\) VALUES .*?( RETURNING .*)?$", r"INSERT INTO \1 (…) VALUES (…)\2", sql)
    sql = re.sub(
        r"^INSERT INTO (\S+) \(.*?\) SELECT \* FROM UNNEST.*?( RETURNING .*)?$",
        r"INSERT INTO \1 (…) SELECT * FROM UNNEST(…)\2",
        sql,
    )
    sql = re.sub(r" RETURNING .{40,}$", " RETURNING …", sql)
    return sql if len(sql) <= 200 else sql[:197] + "…"


def show_sql(worker_pk: int, *, authority: bool, ops_per_lease: int) -> None:
    """One more (unmeasured) run in this process, printing the statements of the last
    call of each kind as they reach cursor.execute (BEGIN and COMMIT are not among them)."""
    from django.db import connection

    from ledger.models import Worker

    worker = Worker.objects.select_related("tenant").get(pk=worker_pk)
    captured: dict[str, list[str]] = {}
    current: list[str] = []
    calls = {"n": 0, "release": 0}

    def record(execute, sql, params, many, context):
        current.append(shorten_sql(sql))
        return execute(sql, params, many, context)

    def traced(kind, fn, **kwargs):
        calls["n"] += 1
        calls["release"] += kind == "release"
        current.clear()
        with connection.execute_wrapper(record):
            value = fn(**kwargs)
        captured[kind] = list(current)
        return value

    fenced_cycles(
        worker, "sql", uuid.uuid4().hex, ops_per_lease, traced, lambda: calls["release"] >= 1, authority=authority
    )
    for kind in KINDS:
        if kind in captured:
            say(
                f"--- {kind} ({'authority' if authority else 'plain'} mode): {len(captured[kind])} statements + BEGIN/COMMIT"
            )
            for line in captured[kind]:
                say(f"    {line}")
    connection.close()


PEER_REQUIREMENTS = ROOT / "tests" / "bench" / "peer-requirements.txt"
PEER_ENV = ROOT / ".bench" / "dbos"


def peer_python() -> Path:
    """The bench-only environment with the pinned DBOS release (created or updated when
    tests/bench/peer-requirements.txt changed); never the product's .venv."""
    python = PEER_ENV / "bin" / "python"
    stamp = PEER_ENV / ".installed"
    if not python.exists():
        say(f"[peer] creating {PEER_ENV.relative_to(ROOT)} for DBOS")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_ENV)], check=True)
    if not stamp.exists() or stamp.stat().st_mtime < PEER_REQUIREMENTS.stat().st_mtime:
        say(f"[peer] installing {', '.join(_pins())} into {PEER_ENV.relative_to(ROOT)}")
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(PEER_REQUIREMENTS)], check=True)
        stamp.touch()
    return python


def _pins() -> list[str]:
    lines = PEER_REQUIREMENTS.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def run_peer(server: Server, args) -> dict:
    """DBOS's durable steps per second at the same N, on the same PostgreSQL (tests/bench/dbos_peer.py)."""
    python = peer_python()
    checkpoint(server, "postgres")
    say(f"[peer] DBOS: {args.workers} processes, {args.seconds} s, workflows of 4 no-op steps")
    done = subprocess.run(
        [str(python), str(ROOT / "tests" / "bench" / "dbos_peer.py"), "--workers", str(args.workers),
         "--seconds", str(args.seconds), "--database-url", server.url_for("postgres")],
        capture_output=True, text=True, timeout=args.seconds + 600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise BenchError(f"the DBOS peer failed: {done.stderr.strip()[-800:]}")
    peer = json.loads(lines[-1])
    say(f"[peer] done: {peer['steps_per_s']:,.1f} DBOS steps/s")
    return peer


def effects_per_s(phase: dict) -> float:
    """Fenced effects (intent -> dispatch -> outcome) completed per second in a phase."""
    return phase["by_kind"]["outcome"]["count"] / phase["elapsed"] if phase["elapsed"] else 0.0


def measure(server: Server, args, modes: list[str], pgbench: str | None) -> tuple[list[dict], dict]:
    """The fenced phases of ``modes`` at N = args.workers, then pgbench at the same N (unless
    skipped), then the DBOS peer (unless skipped; kept in ``pg["peer"]``): what one report (or
    one point of the curve) is made of."""
    fenced_phases = []
    for mode in modes:
        if mode == "http":
            fenced = http_phase_run(server, args)
        else:
            authority = mode == "authority"
            worker_pks = prepare_fenced_db(
                server, BENCH_DB, args.workers, analyze=not args.no_analyze, authority=authority,
                ops_per_lease=args.ops_per_lease,
            )  # fmt: skip
            profile = args.profile and (f"{args.profile}.{mode}" if len(modes) > 1 else args.profile)
            fenced = run_fenced(
                server, BENCH_DB, worker_pks, args, authority=authority, one_call=mode == "effects", profile=profile
            )
            fenced["profile"] = profile
        say(f"[{mode}] done: {fenced['total']:,} transitions in {fenced['elapsed']:.1f} s = {fenced['tps']:,.1f}/s")
        fenced_phases.append(fenced)
    if args.skip_pgbench or pgbench is None:
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
    pg["peer"] = None if args.skip_peer else run_peer(server, args)
    return fenced_phases, pg


def figures(fenced_phases: list[dict], pg: dict) -> dict:
    """The headline numbers of one measurement: rates, ratios to pgbench, dispatch p50s."""
    out: dict = {"pgbench_tps": pg["tps"]}
    for phase in fenced_phases:
        mode = phase["mode"]
        out[f"{mode}_tps"] = phase["tps"]
        out[f"{mode}_ratio"] = phase["tps"] / pg["tps"] if pg["tps"] == pg["tps"] and pg["tps"] else None
        if phase.get("effects_per_s") is not None:
            out[f"{mode}_effects_per_s"] = phase["effects_per_s"]
            out[f"{mode}_requests_per_effect"] = phase["requests_per_effect"]
        dispatch = phase["by_kind"].get("dispatch", {})
        out[f"{mode}_dispatch_p50"] = dispatch.get("p50")
        if phase.get("app_cpu_s") is not None and phase["total"]:
            out[f"{mode}_app_cpu_us"] = 1e6 * phase["app_cpu_s"] / phase["total"]
            out[f"{mode}_app_floor_us"] = phase.get("app_floor_us")
    peer = pg.get("peer")
    if peer:
        out["dbos_steps_per_s"] = peer["steps_per_s"]
        for phase in fenced_phases:
            out[f"{phase['mode']}_effects_per_s"] = effects_per_s(phase)
            out[f"{phase['mode']}_effects_ratio_to_dbos"] = effects_per_s(phase) / peer["steps_per_s"]
    if out.get("plain_dispatch_p50") and out.get("authority_dispatch_p50"):
        out["dispatch_p50_authority_over_plain"] = out["authority_dispatch_p50"] / out["plain_dispatch_p50"]
    return out


def report_peer(by_mode: dict[str, dict], peer: dict | None) -> None:
    """The side-by-side lines: DBOS's durable steps per second against fenced effects per second."""
    if not peer:
        return
    say("-" * 72)
    cpu = peer.get("cpu_ms_per_step")
    say(
        f"DBOS {peer['workers']} processes, workflows of 4 no-op steps: {peer['steps_per_s']:,.1f} durable steps/s"
        + (f", client CPU {cpu:.2f} ms per step" if cpu is not None else "")
    )
    if "plain" in by_mode:
        effects = effects_per_s(by_mode["plain"])
        say(f"fenced effects/s (in process, four calls): {effects:,.1f}, {effects / peer['steps_per_s']:.2f} of DBOS")
    # The in-process line is the effects phase (the one call the clients make) when it ran.
    in_process = "effects" if "effects" in by_mode else "plain"
    for mode, label in ((in_process, "in process"), ("http", "http")):
        if mode in by_mode:
            effects = effects_per_s(by_mode[mode])
            calls = "start (intend, authorize, dispatch) -> outcome" if mode != "plain" else "four calls"
            say(f"fenced effects/s ({label}): {effects:,.1f} ({calls})")
            say(f"effects ratio to DBOS ({label}): {effects / peer['steps_per_s']:.2f}")
        else:
            say(f"effects ratio to DBOS ({label}): n/a (the {mode} phase did not run)")


def report_curve(curve: list[dict], modes: list[str]) -> None:
    """How the rates grow (or not) with N: one line per N, each measured side by side with
    pgbench at the same N."""
    say("-" * 72)
    say("the curve: fenced transitions/s (ratio to pgbench at the same N)")
    say(
        f"{'N':>4}" + "".join(f"{mode:>20}" for mode in modes) + f"{'pgbench TPS':>14}  {'dispatch p50 auth/plain':>28}"
    )
    for point in curve:
        cells = []
        for mode in modes:
            tps, ratio = point.get(f"{mode}_tps"), point.get(f"{mode}_ratio")
            cells.append(f"{tps:,.0f} ({ratio:.3f})" if tps is not None and ratio is not None else f"{tps or 0:,.0f}")
        share = point.get("dispatch_p50_authority_over_plain")
        pair = ""
        if share is not None:
            pair = f"{ms(point['authority_dispatch_p50'])} / {ms(point['plain_dispatch_p50'])} = {share:.2f}"
        say(f"{point['n']:>4}" + "".join(f"{c:>20}" for c in cells) + f"{point['pgbench_tps']:>14,.0f}  {pair:>28}")
    say("=" * 72)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode",
        choices=tuple(MODE_SETS),
        default="all",
        help="fenced phases to run: plain, authority, effects (the one call that starts an effect, in process), "
        "http (the client over HTTP against gunicorn), "
        "both (plain and authority) or all, back to back (default %(default)s)",
    )
    parser.add_argument(
        "--http-workers", type=int, default=4, help="gunicorn worker processes in the http phase (default 4)"
    )
    parser.add_argument(
        "--http-server",
        choices=("gthread", "production", "sync", "uvicorn"),
        default="gthread",
        help="the server of the http phase (tests/bench/http_phase.SERVERS; default gthread, one thread a worker)",
    )
    parser.add_argument(
        "--authority", dest="mode", action="store_const", const="authority", help="same as --mode authority"
    )
    parser.add_argument("--workers", "-n", type=int, default=4, help="worker processes and pgbench clients (default 4)")
    parser.add_argument("--seconds", "-s", type=int, default=15, help="duration of each phase (default 15)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_URL,
        help="any database on the PostgreSQL server to use (default $DATABASE_URL or %(default)s); "
        "the benchmark uses its own databases on that server",
    )
    parser.add_argument("--scale", type=int, default=10, help="pgbench -i scale factor (default %(default)s)")
    parser.add_argument(
        "--ops-per-lease", type=int, default=20, help="operations per lease before release (default 20)"
    )
    parser.add_argument(
        "--pgbench",
        default=shutil.which("pgbench") or "/usr/bin/pgbench",
        help="pgbench executable (default %(default)s)",
    )
    parser.add_argument(
        "--no-analyze", action="store_true", help="skip ANALYZE after the warm-up (planner without statistics)"
    )
    parser.add_argument("--skip-pgbench", action="store_true", help="fenced phases only (no ratio)")
    parser.add_argument("--skip-peer", action="store_true", help="leave out the DBOS peer (no effects ratio to DBOS)")
    parser.add_argument(
        "--curve",
        type=lambda text: [int(n) for n in text.split(",") if n],
        default=[],
        metavar="N,N,...",
        help="after the headline at --workers, measure every mode and pgbench again at each of these N "
        "(e.g. 1,2,4,8,16) and print how the rates grow with concurrency",
    )
    parser.add_argument("--curve-seconds", type=int, default=8, help="duration of each phase of the curve (default 8)")
    parser.add_argument("--summary", metavar="FILE", help="also write the headline and curve figures as JSON to FILE")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="run worker 0 under cProfile and write its stats to FILE (FILE.plain and FILE.authority with --mode both)",
    )
    parser.add_argument(
        "--show-sql",
        action="store_true",
        help="print the SQL statements of one transition of each kind (per mode) after the warm-up, and exit",
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.seconds < 1 or args.ops_per_lease < 1:
        parser.error("--workers, --seconds and --ops-per-lease must be at least 1")
    modes = list(MODE_SETS[args.mode])
    if "authority" in modes and args.ops_per_lease > AUTH_MAX_OPS_PER_LEASE:
        parser.error(
            f"authority mode: --ops-per-lease may be at most {AUTH_MAX_OPS_PER_LEASE} (resources per credential lease)"
        )
    if args.profile:
        args.profile = str(Path(args.profile).resolve())

    try:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise BenchError("psycopg is not installed in this interpreter; use .venv/bin/python") from None
        server = Server(args.database_url)
        pgbench = shutil.which(args.pgbench)
        if not args.skip_pgbench and not args.show_sql and not pgbench:
            raise BenchError(f"pgbench not found ({args.pgbench!r}); install postgresql-client or pass --pgbench PATH")
        gunicorn = Path(sys.executable).with_name("gunicorn")
        if "http" in modes and not args.show_sql and not gunicorn.exists():
            raise BenchError(
                f"gunicorn not found ({gunicorn}): run .ci/bootstrap, or leave the http phase out (--mode both)"
            )
        context = machine_context(server)  # fails here, with the reason, if PostgreSQL is down
        say(
            f"[setup] {context['cores']} cores, load average {context['load'][0]:.2f}; PostgreSQL "
            f"{context['postgresql']} at {server.host}:{server.port}; N={args.workers}, S={args.seconds:g}, "
            f"modes: {', '.join(modes)}"
        )
        if args.show_sql:
            for mode in modes:
                if mode == "http":
                    continue
                worker_pks = prepare_fenced_db(
                    server, BENCH_DB, args.workers, analyze=not args.no_analyze, authority=mode == "authority",
                    ops_per_lease=args.ops_per_lease,
                )  # fmt: skip
                show_sql(worker_pks[0], authority=mode == "authority", ops_per_lease=args.ops_per_lease)
            return 0
        fenced_phases, pg = measure(server, args, modes, pgbench)
        report(context, args, fenced_phases, pg)
        summary = {"n": args.workers, **figures(fenced_phases, pg)}
        curve = []
        if args.curve:
            for n in args.curve:
                at = copy.copy(args)
                at.workers, at.seconds, at.profile = n, args.curve_seconds, None
                say(f"[curve] N = {n}, {at.seconds} s per phase")
                curve.append({"n": n, **figures(*measure(server, at, modes, pgbench))})
            report_curve(curve, modes)
        if args.summary:
            Path(args.summary).write_text(
                json.dumps({"context": {**context, "load": list(context["load"])}, "headline": summary, "curve": curve},
                           default=str, indent=1)
            )  # fmt: skip
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("bench failed: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:
        print(f"bench failed: {describe(exc)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
