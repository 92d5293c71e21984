"""Benchmark: fenced transitions per second against the number of distinct runs touched.

    python tests/bench/contention.py [--workers N] [--seconds S] [--runs 1,2,4,16,64,256] [--rounds K]
    make bench-contention BENCH_ARGS="--seconds 5"

A benchmark, not a test: pytest never collects this file (it does not start with test_).

One phase per R in --runs, back to back, in one database. Before a phase, R fresh runs are
created (setup, not measured). Then N worker processes (each with its own Worker identity
and database connection, as in tests/bench/fenced_transitions.py) loop for S seconds:

    pick one of the R runs at random -> lease_acquire
      -> (operation_intend -> operation_authorize -> operation_dispatch
          -> operation_report_outcome(CONFIRMED)) x 20 (--ops-per-lease)
    -> lease_release -> pick again

the same service calls and the same transition as the plain mode of fenced_transitions.py,
except that the runs are shared instead of one fresh run per cycle. A lease_acquire refused
with LEASE_HELD (another worker holds that run) is counted as a refusal, not a transition;
the worker sleeps --backoff-ms and picks again (with R = 1, the same run). Every other
successful call (acquire, intend, authorize, dispatch, outcome, release) counts as one
fenced transition; transitions/s = total / wall time from the common start to the moment
the last process stopped. Latencies are perf_counter around each counted call.

With R = 1 every worker fights for one run: one holds its lease, the others are refused,
and every refused attempt also takes the run's row lock (FOR UPDATE) for its check, so it
waits behind the holder's transitions and they behind it. The parent samples
pg_stat_activity every 0.2 s and reports the mean number of the phase's backends waiting
on a lock (wait_event_type = 'Lock').

The data lives in a dedicated database (``fenceline_bench_contention``), dropped, recreated
and migrated once per invocation; the URL names the server only. No other database is
created, changed or dropped. The phases share that database, so later phases run on
slightly larger tables (a few thousand rows per phase). On a shared machine one phase of a
few seconds is noisy: --rounds K repeats the phases K times (every other round in reverse
order) and reports the median of each figure, with each round's rate beside it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import random
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import (  # noqa: E402
    AUTH_ACTION,
    AUTH_TOOL,
    DEFAULT_URL,
    LEASE_TTL_S,
    PROGRESS_EVERY_S,
    TENANT_SLUG,
    WARMUP_RUNS,
    BenchError,
    Server,
    checkpoint,
    cpu_busy,
    cpu_busy_cores,
    describe,
    django_setup,
    fenced_cycles,
    machine_context,
    ms,
    percentile,
    say,
)

CONTENTION_DB = "fenceline_bench_contention"  # dropped and recreated by every run; no other one is
DEFAULT_RUNS = (1, 2, 4, 16, 64, 256)
KINDS = ("acquire", "intend", "authorize", "dispatch", "outcome", "release")
LOCK_SAMPLE_S = 0.2


def recreate_database(server: Server, name: str) -> None:
    from psycopg import sql

    if name != CONTENTION_DB:
        raise BenchError(f"refusing to drop database {name!r}: only {CONTENTION_DB} is recreated")
    with server.connect_admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def prepare_database(server: Server, workers: int, ops_per_lease: int) -> list[int]:
    """Recreate and migrate the database, make the tenant and N worker identities, warm up
    with the plain cycle of fenced_transitions.py (unmeasured) and ANALYZE."""
    recreate_database(server, CONTENTION_DB)
    say(f"[setup] database {CONTENTION_DB}: recreated; running migrations")
    django_setup(server.url_for(CONTENTION_DB))
    from django.apps import apps
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    if connection.settings_dict["NAME"] != CONTENTION_DB:
        raise BenchError(f"Django is not connected to PostgreSQL database {CONTENTION_DB}")
    from ledger.models import Worker
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    tenant, _ = tenant_ensure(slug=TENANT_SLUG)
    stamp = uuid.uuid4().hex[:8]
    pks = [worker_create(tenant=tenant, name=f"contention-{stamp}-{i}")[0].pk for i in range(workers)]
    warm = Worker.objects.select_related("tenant").get(pk=pks[0])
    calls = {"n": 0}

    def plain_call(kind, fn, **kwargs):
        calls["n"] += 1
        return fn(**kwargs)

    per_run = 2 + 4 * ops_per_lease
    fenced_cycles(
        warm, "warmup", uuid.uuid4().hex, ops_per_lease, plain_call, lambda: calls["n"] >= WARMUP_RUNS * per_run
    )
    with connection.cursor() as cursor:
        for label in ("ledger", "approvals"):
            for model in apps.get_app_config(label).get_models():
                if model._meta.managed and not model._meta.proxy:
                    cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
    say(f"[setup] migrated; tenant {TENANT_SLUG!r}, {workers} workers; warm-up {WARMUP_RUNS} runs, ANALYZE done")
    connection.close()
    return pks


def create_runs(worker_pk: int, count: int) -> list[str]:
    """R fresh runs of the tenant (setup of a phase, not measured)."""
    from django.db import connection

    from ledger.models import Worker
    from ledger.services.fence.runs import run_create
    from ledger.versioning import CURRENT_SCHEMA_VERSION

    worker = Worker.objects.select_related("tenant").get(pk=worker_pk)
    runs = [str(run_create(worker=worker, schema_version=CURRENT_SCHEMA_VERSION)[0].pk) for _ in range(count)]
    connection.close()
    return runs


def shared_cycles(worker, index, run_ids, key_prefix, ops_per_lease, backoff_s, call, refused, stop) -> None:
    """Until ``stop()``: a random run of ``run_ids``, its lease (or a refusal and a backoff),
    ``ops_per_lease`` operations intend -> authorize -> dispatch -> outcome(CONFIRMED), release."""
    from ledger.errors import LeaseHeld
    from ledger.services.core.intent import Intent
    from ledger.services.fence.leases import lease_acquire, lease_release
    from ledger.services.fence.operations import operation_authorize, operation_dispatch, operation_intend
    from ledger.services.fence.outcomes import operation_report_outcome
    from ledger.states import EffectClass, Outcome

    owner = f"contention-owner-{index}"
    pick = random.Random(f"{key_prefix}-{index}").choice  # noqa: S311 - picks runs, no secret
    seq = 0
    while not stop():
        run_id = pick(run_ids)
        started = time.perf_counter()
        try:
            lease = call("acquire", lease_acquire, worker=worker, run_id=run_id, owner_id=owner, ttl_s=LEASE_TTL_S)
        except LeaseHeld:
            refused(time.perf_counter() - started)
            if backoff_s:
                time.sleep(backoff_s)
            continue
        token = lease.fencing_token
        for _ in range(ops_per_lease):
            seq += 1
            intent = Intent(
                tool=AUTH_TOOL,
                action=AUTH_ACTION,
                resource=f"bench://{index}/{seq}",
                effect_class=EffectClass.IDEMPOTENT,
                idempotency_key=f"{key_prefix}-{index}-{seq}",
            )
            if stop():
                return
            op, created = call(
                "intend", operation_intend, worker=worker, run_id=run_id, fencing_token=token, intent=intent
            )
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
        call("release", lease_release, worker=worker, run_id=run_id, owner_id=owner, fencing_token=token)


def worker_main(index, database_url, worker_pk, run_ids, args, key_prefix, counters, ready, go, start_at, results):
    """One benchmark process. Reports ("ready", i), then ("result", i, {...}) or ("error", i, text)."""
    try:
        django_setup(database_url)
        from django.db import connection

        from ledger.models import Worker

        worker = Worker.objects.select_related("tenant").get(pk=worker_pk)
        connection.ensure_connection()
        latencies = {kind: [] for kind in KINDS}
        refusals: list[float] = []
        count = 0
        ready.put(("ready", index))
        go.wait()
        deadline = start_at.value + args.seconds
        perf = time.perf_counter

        def call(kind, fn, **kwargs):
            nonlocal count
            started = perf()
            try:
                value = fn(**kwargs)
            except Exception as exc:
                exc.bench_call = fn.__name__
                raise
            latencies[kind].append(perf() - started)
            count += 1
            counters[index] = count
            return value

        def stop() -> bool:
            return time.monotonic() >= deadline

        shared_cycles(
            worker, index, run_ids, key_prefix, args.ops_per_lease, args.backoff_ms / 1000, call, refusals.append, stop
        )
        finished = time.monotonic()
        connection.close()
        results.put(
            ("result", index, {"count": count, "finished": finished, "latencies": latencies, "refusals": refusals})
        )
    except BaseException as exc:  # reported to the parent, which fails the run
        line = describe(exc)
        try:
            ready.put(("error", index, line))
            results.put(("error", index, line))
        finally:
            sys.exit(1)


class LockWaits:
    """Samples, every LOCK_SAMPLE_S from its own connection, how many backends of the
    database are waiting on a heavyweight lock (row locks show up as 'transactionid' or
    'tuple' waits)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.samples: list[int] = []
        self._stop = None
        self._thread = None

    def start(self) -> None:
        import threading

        self._stop = threading.Event()
        conn = self.server.connect_admin()

        def run():
            try:
                while not self._stop.wait(LOCK_SAMPLE_S):
                    waiting = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                        [CONTENTION_DB],
                    ).fetchone()[0]
                    self.samples.append(int(waiting))
            finally:
                conn.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return sum(self.samples) / len(self.samples) if self.samples else None


def run_phase(server: Server, worker_pks: list[int], runs: int, args) -> dict:
    url = server.url_for(CONTENTION_DB)
    django_setup(url)
    run_ids = create_runs(worker_pks[0], runs)
    ctx = mp.get_context("spawn")
    n = args.workers
    counters = ctx.Array("q", n, lock=False)
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    start_at = ctx.Value("d", 0.0, lock=False)
    key_prefix = uuid.uuid4().hex
    tag = f"[R={runs}]"
    procs = [
        ctx.Process(
            target=worker_main,
            args=(i, url, worker_pks[i], run_ids, args, key_prefix, counters, ready, go, start_at, results),
            name=f"contention-worker-{i}",
        )
        for i in range(n)
    ]
    say(f"{tag} {runs} fresh runs created; starting {n} worker processes")
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
        checkpoint(server, CONTENTION_DB)
        waits = LockWaits(server)
        waits.start()
        cpu_before = cpu_busy()
        say(f"{tag} all {n} workers connected; measuring for {args.seconds:g} s")
        start_at.value = time.monotonic()
        go.set()
        collected: dict[int, dict] = {}
        next_report = start_at.value + PROGRESS_EVERY_S
        while len(collected) < n:
            try:
                message = results.get(timeout=max(0.05, next_report - time.monotonic()))
            except queue.Empty:
                message = None
            if message is not None:
                if message[0] == "error":
                    raise BenchError(f"worker {message[1]} failed: {message[2]}")
                collected[message[1]] = message[2]
            now = time.monotonic()
            if now >= next_report:
                elapsed = now - start_at.value
                total = sum(counters[:])
                say(f"{tag} {elapsed:5.1f} s elapsed: {total} transitions ({total / elapsed:,.0f}/s)")
                next_report += PROGRESS_EVERY_S
            if now > start_at.value + args.seconds + 120:
                raise BenchError("workers did not finish within 120 s after the deadline")
            if message is None and not any(p.is_alive() for p in procs) and len(collected) < n:
                try:
                    message = results.get(timeout=1)
                except queue.Empty:
                    raise BenchError("a worker process exited without reporting") from None
                if message[0] == "error":
                    raise BenchError(f"worker {message[1]} failed: {message[2]}")
                collected[message[1]] = message[2]
        cpu_after = cpu_busy()
        lock_waiting = waits.stop()
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    elapsed = max(r["finished"] for r in collected.values()) - start_at.value
    total = sum(r["count"] for r in collected.values())
    latencies = sorted(x for r in collected.values() for values in r["latencies"].values() for x in values)
    refusals = sorted(x for r in collected.values() for x in r["refusals"])
    acquires = sum(len(r["latencies"]["acquire"]) for r in collected.values())
    phase = {
        "runs": runs,
        "total": total,
        "elapsed": elapsed,
        "tps": total / elapsed,
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
        "acquires": acquires,
        "refused": len(refusals),
        "refused_p50": percentile(refusals, 0.50),
        "lock_waiting": lock_waiting,
        "busy_cores": cpu_busy_cores(cpu_before, cpu_after),
    }
    say(
        f"{tag} done: {total:,} transitions in {elapsed:.1f} s = {phase['tps']:,.1f}/s; "
        f"{acquires:,} leases taken, {len(refusals):,} refused LEASE_HELD"
    )
    return phase


def aggregate(phases: list[dict]) -> list[dict]:
    """One row per number of runs: the median over its rounds of each figure."""
    from statistics import median

    rows = []
    for runs in sorted({ph["runs"] for ph in phases}):
        mine = [ph for ph in phases if ph["runs"] == runs]
        waits = [ph["lock_waiting"] for ph in mine if ph["lock_waiting"] is not None]
        busy = [ph["busy_cores"] for ph in mine if ph["busy_cores"] is not None]
        refused = [ph["refused_p50"] for ph in mine if ph["refused"]]
        rows.append(
            {
                "runs": runs,
                "tps": median(ph["tps"] for ph in mine),
                "each": [ph["tps"] for ph in mine],
                "p50": median(ph["p50"] for ph in mine),
                "p99": median(ph["p99"] for ph in mine),
                "leases_per_s": median(ph["acquires"] / ph["elapsed"] for ph in mine),
                "refused_per_s": median(ph["refused"] / ph["elapsed"] for ph in mine),
                "refused_p50": median(refused) if refused else float("nan"),
                "lock_waiting": median(waits) if waits else None,
                "busy_cores": median(busy) if busy else None,
            }
        )
    return rows


def report(context: dict, args, phases: list[dict]) -> None:
    import django

    say()
    say("=" * 96)
    say(f"Fenceline contention benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    load = context["load"]
    say(
        f"machine: {context['cores']} cores ({context['cpu_model'] or 'unknown CPU'}); "
        f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    )
    pgs = context["pg_settings"]
    say(
        f"PostgreSQL {context['postgresql']} (synchronous_commit={pgs['synchronous_commit']}, fsync={pgs['fsync']}, "
        f"shared_buffers={pgs['shared_buffers']}); Python {context['python']}, Django {django.get_version()}"
    )
    say(f"code: git {context['code']}")
    say(
        f"N = {args.workers} worker processes, S = {args.seconds:g} s per phase, {args.ops_per_lease} operations per "
        f"lease, backoff after a refusal {args.backoff_ms:g} ms"
    )
    say("-" * 96)
    rows = aggregate(phases)
    reference = max(rows, key=lambda row: row["runs"])
    header = (
        f"{'runs':>6}{'transitions/s':>15}{'ratio to R=' + str(reference['runs']):>15}{'p50':>11}{'p99':>11}"
        f"{'leases/s':>10}{'refused/s':>11}{'refused p50':>13}{'lock-waiting':>14}{'cores busy':>11}"
    )
    if args.rounds > 1:
        header += "  transitions/s of each round"
    say(header)
    for row in rows:
        ratio = row["tps"] / reference["tps"] if reference["tps"] else float("nan")
        waiting = "n/a" if row["lock_waiting"] is None else f"{row['lock_waiting']:.2f}"
        busy = "n/a" if row["busy_cores"] is None else f"{row['busy_cores']:.2f}"
        refused_p50 = ms(row["refused_p50"]) if row["refused_per_s"] else "-"
        line = (
            f"{row['runs']:>6}{row['tps']:>15,.1f}{ratio:>15.3f}{ms(row['p50']):>11}{ms(row['p99']):>11}"
            f"{row['leases_per_s']:>10,.1f}{row['refused_per_s']:>11,.1f}{refused_p50:>13}{waiting:>14}{busy:>11}"
        )
        if args.rounds > 1:
            line += "  " + " / ".join(f"{tps:,.0f}" for tps in row["each"])
        say(line)
    say("-" * 96)
    by_runs = {row["runs"]: row for row in rows}
    hot, spread = by_runs.get(1), by_runs.get(args.workers)
    if hot and spread and spread["tps"]:
        say(
            f"the cost of one hot run: {hot['tps']:,.1f} transitions/s with all {args.workers} workers on one run, "
            f"against {spread['tps']:,.1f}/s with R = {args.workers} runs ({spread['tps'] / args.workers:,.1f}/s per "
            f"run) = {hot['tps'] / spread['tps']:.3f} of it"
        )
    else:
        say(f"(the cost of one hot run needs R = 1 and R = {args.workers} (= --workers) in --runs)")
    if args.rounds > 1:
        say(
            f"each figure is the median over {args.rounds} rounds (odd rounds in --runs order, even rounds reversed); "
            "ratios are of medians"
        )
    say(
        "lock-waiting = mean number of the phase's backends waiting on a lock (pg_stat_activity, every "
        f"{LOCK_SAMPLE_S:g} s); cores busy = whole machine (/proc/stat), not only this benchmark;"
    )
    say(" refused = lease_acquire answered LEASE_HELD (not a transition); latencies are of counted transitions only")
    say("=" * 96)


def parse_runs(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--runs takes a comma-separated list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("--runs needs at least one value, each at least 1")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", "-n", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--seconds", "-s", type=float, default=10, help="duration of each phase (default 10)")
    parser.add_argument(
        "--runs",
        type=parse_runs,
        default=list(DEFAULT_RUNS),
        help=f"comma-separated numbers of distinct runs, one phase each (default {','.join(map(str, DEFAULT_RUNS))})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat the --runs phases this many times (odd rounds reversed) and report medians (default 1)",
    )
    parser.add_argument(
        "--ops-per-lease", type=int, default=20, help="operations per lease before release (default 20)"
    )
    parser.add_argument(
        "--backoff-ms", type=float, default=5.0, help="sleep after a LEASE_HELD refusal (default %(default)s)"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_URL,
        help="any database on the PostgreSQL server to use (default $DATABASE_URL or %(default)s); "
        f"the benchmark uses its own database {CONTENTION_DB} on that server",
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.rounds < 1 or args.seconds <= 0 or args.ops_per_lease < 1 or args.backoff_ms < 0:
        parser.error(
            "--workers, --rounds and --ops-per-lease must be at least 1, --seconds positive, --backoff-ms >= 0"
        )
    try:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise BenchError("psycopg is not installed in this interpreter; use .venv/bin/python") from None
        server = Server(args.database_url)
        context = machine_context(server)
        say(
            f"[setup] {context['cores']} cores, load average {context['load'][0]:.2f}; PostgreSQL "
            f"{context['postgresql']} at {server.host}:{server.port}; N={args.workers}, S={args.seconds:g}, "
            f"R in {', '.join(map(str, args.runs))}"
        )
        worker_pks = prepare_database(server, args.workers, args.ops_per_lease)
        phases = []
        for round_index in range(args.rounds):
            order = args.runs if round_index % 2 == 0 else list(reversed(args.runs))
            if args.rounds > 1:
                say(f"[round {round_index + 1} of {args.rounds}] R in {', '.join(map(str, order))}")
            phases += [run_phase(server, worker_pks, runs, args) for runs in order]
        report(context, args, phases)
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
