"""Benchmark: the set-based sweeps of what runs leave behind (issues 12 and 16).

    python tests/bench/reapers.py [--items 100000]
    make bench-reapers BENCH_ARGS="--items 100000"

A benchmark, not a test: pytest never collects this file. It recreates its own database
(``fenceline_bench_reapers``), migrates it, and bulk-inserts the rows the services would
have written (a tenant, a worker, runs with their lease and instance, their resources,
approvals and cost reservations), then times five sweeps, one after the other, each to the
end of its backlog:

1. ``leases_reap``: N runs whose lease expired (no operation in flight) -> each lease ends
   (LEASE_EXPIRED), its instance EXPIRED;
2. ``instances_settle`` (the resource reaper's instance pass): those N EXPIRED instances ->
   REAPING -> RELEASED (no resource open);
3. ``resources_reap``: N ACTIVE resources past their deadline (ten per run, on N/10 runs with
   a live lease), closed by a driver that answers CLOSED at once (``--driver instant``, the
   default: the reaper's own cost) or by the sandbox driver (``--driver sandbox``: a pretend
   provider that appends to a log file and creates a marker file per close, about 90 us of
   this process's CPU each) -> RELEASE_REQUESTED -> RELEASING -> RELEASED, one
   RESOURCE_RELEASED event each;
4. ``approvals_expire`` (the approval expiry job): N PENDING approvals past their expiry
   (ten per run, on the N/10 runs with a live lease, each bound to an operation waiting
   for it) -> EXPIRED, one APPROVAL_EXPIRED event each;
5. ``reservations_expire`` (the reservation timeout job): N RESERVED cost reservations past
   their expiry (ten per run, on the same runs, each of a DISPATCHED operation whose worker
   never reported) -> UNKNOWN, one COST_UNKNOWN event each (and the tenant's breaker goes
   UNKNOWN once). The seeded reservations are charged to no budget window: the job never
   touches one.

For each sweep: items, items per second, the seconds 100,000 items take at that rate, SQL
statements per item (every statement Django sends, counted by an execute wrapper), and the
peak resident set of the process during the sweep (the kernel's high-water mark, reset
before each sweep; ru_maxrss for the whole run where that reset is not available).
``--trace-memory`` adds tracemalloc's peak Python memory per sweep; it slows Python several
times, so its run's items/s are not the figures to quote.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import sys
import tempfile
import time
import tracemalloc
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

DATABASE = "fenceline_bench_reapers"
CHUNK = 5000  # rows per bulk INSERT while seeding
SWEEPS = ("leases_reap", "instances_settle", "resources_reap", "approvals_expire", "reservations_expire")
TRACE_MEMORY = False  # --trace-memory: tracemalloc's peak, at the cost of a slower Python
PROFILE: str | None = None  # --profile FILE: cProfile of each sweep into FILE.<sweep>
DRIVER = "instant"  # --driver: what closes the resource reaper's resources
PROCESSES = 1  # --processes N: copies of each sweep at once, as `reap_leases --processes N` runs them
ROOT = Path(__file__).resolve().parents[2]


def say(text: str) -> None:
    print(text, flush=True)


def setup_django(url: str) -> None:
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    admin = psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        dbname="postgres",
        autocommit=True,
    )
    with admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path="/" + DATABASE))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("FENCELINE_SANDBOX_DIR", tempfile.mkdtemp(prefix="fenceline-bench-sandbox-"))
    if DRIVER == "instant":
        os.environ["FENCELINE_RESOURCE_DRIVERS"] = '{"*:sandbox": "tests.bench.reapers.InstantDriver"}'
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def seed(items: int) -> None:
    from django.utils import timezone

    from ledger.chain import GENESIS_HASH
    from ledger.models import LeaseGrant, Run, RunLease, RunResource
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure
    from ledger.states import InstanceState

    tenant, _ = tenant_ensure(slug="bench")
    worker, _ = worker_create(tenant=tenant, name="bench-worker")
    now = timezone.now()
    chunk = CHUNK

    def runs_with_leases(count: int, *, expired: bool, prefix: str) -> list[uuid.UUID]:
        ids = []
        for start in range(0, count, chunk):
            batch = [uuid.uuid4() for _ in range(min(chunk, count - start))]
            Run.objects.bulk_create(
                [Run(id=pk, tenant=tenant, last_hash=GENESIS_HASH, last_progress_at=now) for pk in batch]
            )
            expires = now - timedelta(seconds=5) if expired else now + timedelta(hours=1)
            RunLease.objects.bulk_create(
                [
                    RunLease(
                        run_id=pk,
                        owner_id=f"{prefix}-{n}",
                        worker=worker,
                        fencing_token=1,
                        acquired_at=now - timedelta(minutes=5),
                        expires_at=expires,
                        last_renewed_at=now - timedelta(minutes=1),
                        instance_state=InstanceState.RUNNING,
                    )
                    for n, pk in enumerate(batch)
                ]
            )
            LeaseGrant.objects.bulk_create(
                [
                    LeaseGrant(
                        run_id=pk,
                        tenant=tenant,
                        fencing_token=1,
                        owner_id=f"{prefix}-{n}",
                        worker=worker,
                        acquired_at=now - timedelta(minutes=5),
                        state=InstanceState.RUNNING,
                        state_changed_at=now,
                    )
                    for n, pk in enumerate(batch)
                ]
            )
            ids += batch
        return ids

    say(f"[seed] {items:,} runs with an expired lease ...")
    runs_with_leases(items, expired=True, prefix="gone")
    holders = max(1, items // 10)
    say(f"[seed] {items:,} ACTIVE resources past their deadline on {holders:,} runs with a live lease ...")
    live = runs_with_leases(holders, expired=False, prefix="live")
    instances = dict(LeaseGrant.objects.filter(run_id__in=live).values_list("run_id", "pk"))
    for start in range(0, items, chunk):
        RunResource.objects.bulk_create(
            [
                RunResource(
                    tenant=tenant,
                    run_id=live[n % holders],
                    instance_id=instances[live[n % holders]],
                    kind="sandbox",
                    provider="sandbox",
                    handle=f"sb-{n}",
                    created_at=now - timedelta(hours=2),
                    expires_at=now - timedelta(seconds=1),
                )
                for n in range(start, min(items, start + chunk))
            ]
        )
    # As resource_attach counts them on the run (Run.n_resources), which lease ends read.
    Run.objects.filter(pk__in=live).update(n_resources=items // holders + 1)
    say(f"[seed] {items:,} PENDING approvals past their expiry on the same {holders:,} runs ...")
    seed_approvals(tenant, live, items, now)
    say(f"[seed] {items:,} RESERVED cost reservations past their expiry on the same {holders:,} runs ...")
    seed_reservations(tenant, live, items, now)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def seed_operations(tenant, runs: list, items: int, now, *, phase: str, prefix: str) -> list[tuple]:
    """``items`` operations in ``phase``, spread evenly over ``runs``: (run_id, pk) each."""
    from ledger.models import Operation
    from ledger.states import EffectClass, Phase

    dispatched = phase == Phase.DISPATCHED
    made = []
    for start in range(0, items, CHUNK):
        batch = [
            Operation(
                id=uuid.uuid4(),
                tenant=tenant,
                run_id=runs[n % len(runs)],
                idempotency_key=f"{prefix}-{n}",
                tool="mail",
                action="send",
                resource=f"customer-{n}",
                effect_class=EffectClass.NON_RETRYABLE,
                args_digest="sha256:" + "0" * 64,
                provider="mailer",
                estimated_cost_cents=5,
                phase=phase,
                updated_at=now - timedelta(minutes=10),
                dispatched_at=now - timedelta(minutes=10) if dispatched else None,
                fencing_token=1 if dispatched else None,
                dispatch_owner_id="live-0" if dispatched else None,
            )
            for n in range(start, min(items, start + CHUNK))
        ]
        Operation.objects.bulk_create(batch)
        made += [(op.run_id, op.pk) for op in batch]
    return made


def _count_on_runs(runs: list, field: str, model, **where) -> None:
    """Add each run's rows of ``model`` (matching ``where``) to its counter ``field``, as the
    services count them with the chain head."""
    from django.db.models import Count, F, OuterRef, Subquery

    from ledger.models import Run

    rows = model.objects.filter(run_id=OuterRef("pk"), **where).order_by().values("run_id")
    per_run = Subquery(rows.annotate(n=Count("pk")).values("n")[:1])
    Run.objects.filter(pk__in=runs).update(**{field: F(field) + per_run})


def seed_approvals(tenant, runs: list, items: int, now) -> None:
    """What approval_open writes for operations that wait for a person: PENDING requests,
    here all past their expiry, each bound to its operation's attempt and the token."""
    from approvals.models import ApprovalRequest, ApprovalStatus
    from ledger.models import Operation
    from ledger.states import ApprovalKind, Phase

    operations = seed_operations(tenant, runs, items, now, phase=Phase.PENDING_APPROVAL, prefix="ask")
    for start in range(0, items, CHUNK):
        ApprovalRequest.objects.bulk_create(
            [
                ApprovalRequest(
                    tenant=tenant,
                    run_id=run_id,
                    kind=ApprovalKind.OPERATION,
                    operation_id=op_id,
                    attempt=1,
                    args_digest="sha256:" + "0" * 64,
                    fencing_token=1,
                    status=ApprovalStatus.PENDING,
                    requested_at=now - timedelta(hours=1),
                    expires_at=now - timedelta(seconds=1),
                )
                for run_id, op_id in operations[start : start + CHUNK]
            ]
        )
    _count_on_runs(runs, "n_pending_approval", Operation, phase=Phase.PENDING_APPROVAL)
    _count_on_runs(runs, "n_approvals", ApprovalRequest)


def seed_reservations(tenant, runs: list, items: int, now) -> None:
    """What cost_reserve writes at dispatch: a RESERVED reservation per operation attempt,
    here all past their expiry (the worker never reported)."""
    from ledger.models import CostReservation, Operation
    from ledger.states import Phase, ReservationState

    operations = seed_operations(tenant, runs, items, now, phase=Phase.DISPATCHED, prefix="spend")
    for start in range(0, items, CHUNK):
        CostReservation.objects.bulk_create(
            [
                CostReservation(
                    tenant=tenant,
                    run_id=run_id,
                    operation_id=op_id,
                    attempt=1,
                    provider="mailer",
                    estimated_cents=5,
                    state=ReservationState.RESERVED,
                    created_at=now - timedelta(minutes=10),
                    expires_at=now - timedelta(seconds=1),
                )
                for run_id, op_id in operations[start : start + CHUNK]
            ]
        )
    _count_on_runs(runs, "n_dispatched", Operation, phase=Phase.DISPATCHED)


class InstantDriver:
    """A provider that has closed everything already: ``--driver instant`` times the reaper
    alone, with no provider work in its process."""

    name = "instant"

    def close(self, resource):
        from ledger.services.lifespan.drivers import Closed, Closing

        return Closing(Closed.CLOSED)


class Counter:
    def __init__(self) -> None:
        self.statements = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        return execute(sql, params, many, context)


def _reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of this process's resident set (Linux), so that
    the next reading is the peak of what follows. False where that is not available."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def _rss_mb() -> float:
    """The resident set now (VmRSS), 0 where /proc is not available."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _peak_rss_mb(reset: bool) -> float:
    """The peak resident set since the reset (VmHWM), or for the whole process (ru_maxrss)."""
    if reset:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sweep_once(name: str, fn) -> dict:
    """One copy of a sweep, measured in the process that runs it: what it did, its
    statements, its peak resident set and (--trace-memory) peak Python memory."""
    from django.db import connection

    counter = Counter()
    reset = _reset_peak_rss()
    rss_before = _rss_mb()
    if TRACE_MEMORY:
        tracemalloc.start()
    profiler = cProfile.Profile(time.process_time) if PROFILE else None  # CPU, not waiting
    with connection.execute_wrapper(counter):
        done = profiler.runcall(fn) if profiler else fn()
    if profiler:
        path = f"{PROFILE}.{name}"
        profiler.dump_stats(path)
        say(f"[{name}] cProfile (CPU time, the sweep only) written to {path}; top functions by internal time:")
        pstats.Stats(path, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    peak = tracemalloc.get_traced_memory()[1] if TRACE_MEMORY else 0
    tracemalloc.stop()
    peak_rss = _peak_rss_mb(reset)
    return {
        "done": done,
        "statements": counter.statements,
        "peak_python": peak,
        "peak_rss": peak_rss,
        "rss_scope": "sweep" if reset else "process",
        "growth": max(0.0, peak_rss - rss_before) if reset else 0.0,
    }


def measure(name: str, items: int, fn) -> dict:
    """Time one sweep, in --processes copies at once (each forked from this process)."""
    from ledger.services.operating.processes import in_processes

    _checkpoint()  # every sweep starts from clean buffers: its WAL has the same full-page images
    wal_before = _wal_lsn()
    started = time.perf_counter()
    copies = in_processes(lambda index: _sweep_once(name, fn), PROCESSES)
    seconds = time.perf_counter() - started
    wal = _wal_lsn() - wal_before
    done = sum(copy["done"] for copy in copies)
    statements = sum(copy["statements"] for copy in copies)
    peak = max(copy["peak_python"] for copy in copies)
    row_rss = max(copy["peak_rss"] for copy in copies)
    scope = "sweep" if all(copy["rss_scope"] == "sweep" for copy in copies) else "process"
    growth = max(copy["growth"] for copy in copies)
    per_s = done / seconds if seconds else 0
    row = {
        "sweep": name,
        "items": done,
        "seconds": seconds,
        "per_s": per_s,
        "seconds_100k": 100_000 / per_s if per_s else 0,
        "statements_per_item": statements / done if done else 0,
        "wal_per_item": wal / done if done else 0,
        "peak_python_mb": peak / 2**20,
        "peak_rss_mb": row_rss,
        "rss_scope": scope,
        "rss_growth_mb": growth,
        "processes": PROCESSES,
    }
    traced = f"; peak Python memory {row['peak_python_mb']:.1f} MB" if TRACE_MEMORY else ""
    say(
        f"[{name}] {done:,} items in {seconds:.1f} s{_in_processes()} = {per_s:,.0f}/s ({row['seconds_100k']:.1f} s per 100k); "
        f"{row['statements_per_item']:.3f} statements and {row['wal_per_item']:,.0f} B of WAL per item{traced}; "
        f"peak RSS {row['peak_rss_mb']:.0f} MB ({row['rss_scope']}; +{row['rss_growth_mb']:.0f} MB over its start)"
    )
    if done != items:
        say(f"[{name}] WARNING: expected {items:,} items")
    return row


def _wal_lsn() -> int:
    """The server's WAL position in bytes (every database's writes: read it on a quiet server)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def _checkpoint() -> None:
    """CHECKPOINT, where this role may (a superuser): else the WAL per item depends on when
    the server last wrote one."""
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except DatabaseError:
        pass


def _in_processes() -> str:
    return f" in {PROCESSES} processes at once (peak RSS: the largest one's)" if PROCESSES > 1 else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--items",
        type=int,
        default=100_000,
        help="expired leases, and expired resources, approvals and reservations (100000)",
    )
    parser.add_argument(
        "--sweeps",
        default=",".join(SWEEPS),
        help="the sweeps to time, comma-separated, run in the order above (all); instances_settle"
        " sweeps the instances leases_reap expired, so it needs leases_reap before it",
    )
    parser.add_argument(
        "--verify",
        type=int,
        default=1000,
        metavar="RUNS",
        help="after the sweeps (untimed), verify the chains of this many of the swept runs, drawn at random (1000)",
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1/"))
    parser.add_argument(
        "--trace-memory", action="store_true", help="peak Python memory (tracemalloc; slows the sweeps)"
    )
    parser.add_argument(
        "--driver",
        choices=("instant", "sandbox"),
        default="instant",
        help="what closes resources_reap's resources: instant (answers CLOSED at once: the reaper's own cost;"
        " the default) or sandbox (the demo's pretend provider, with its files)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="copies of each sweep at once, each in a process forked from this one, as the sweep commands'"
        " --processes runs them (1)",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="profile each sweep under cProfile (CPU time; slows it) into FILE.<sweep> and print its top functions",
    )
    args = parser.parse_args()
    chosen = {name.strip() for name in args.sweeps.split(",") if name.strip()}
    if chosen - set(SWEEPS):
        parser.error(f"unknown sweep(s): {', '.join(sorted(chosen - set(SWEEPS)))}; known: {', '.join(SWEEPS)}")
    global TRACE_MEMORY, PROFILE, PROCESSES, DRIVER
    DRIVER = args.driver
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.profile and args.processes > 1:
        parser.error("--profile profiles one process: use it with --processes 1")
    PROCESSES = args.processes
    TRACE_MEMORY = args.trace_memory
    PROFILE = args.profile and str(Path(args.profile).resolve())
    setup_django(args.database_url)
    seed(args.items)
    if "resources_reap" in chosen:
        say(f"[resources_reap] driver: {DRIVER}")

    from approvals.services.approvals import approvals_expire
    from ledger.services.authority.reservations import reservations_expire
    from ledger.services.fence.leases import leases_reap
    from ledger.services.lifespan.reaper import ResourceReapResult, instances_settle, resources_reap

    sweeps = {
        "leases_reap": lambda: leases_reap().leases,
        "instances_settle": lambda: _settled(instances_settle, ResourceReapResult),
        "resources_reap": lambda: resources_reap().released,
        "approvals_expire": approvals_expire,
        "reservations_expire": reservations_expire,
    }
    rows = [measure(name, args.items, sweeps[name]) for name in SWEEPS if name in chosen]
    if args.verify:
        verify_sample(args.verify)
    say("")
    rss = "peak RSS MB" if all(row["rss_scope"] == "sweep" for row in rows) else "max RSS MB"
    say(
        f"{'sweep':<21}{'procs':>6}{'items':>10}{'items/s':>10}{'s per 100k':>12}{'stmts/item':>12}{'WAL/item':>10}"
        f"{'peak Py MB':>12}{rss:>13}{'RSS +MB':>11}"
    )
    for row in rows:
        say(
            f"{row['sweep']:<21}{row['processes']:>6}{row['items']:>10,}{row['per_s']:>10,.0f}{row['seconds_100k']:>12.1f}"
            f"{row['statements_per_item']:>12.3f}{row['wal_per_item']:>10,.0f}"
            f"{(format(row['peak_python_mb'], '.1f') if TRACE_MEMORY else '-'):>12}{row['peak_rss_mb']:>13.0f}"
            f"{row['rss_growth_mb']:>11.0f}"
        )


def verify_sample(count: int) -> None:
    """The ledger verifier over ``count`` swept runs drawn at random: every event the sweeps
    appended must verify (hash chain, MAC, head)."""
    from ledger.models import Run
    from ledger.services.evidence.verification import ledger_verify

    run_ids = list(Run.objects.filter(last_seq__gt=0).order_by("?").values_list("pk", flat=True)[:count])
    result = ledger_verify(run_ids=run_ids)
    say(f"[verify] {result.runs:,} swept runs drawn at random, {result.events:,} events: {result.broken} BROKEN")
    if result.broken:
        say("[verify] WARNING: a swept chain does not verify")


def _settled(instances_settle, result_type) -> int:
    from django.conf import settings

    result = result_type()
    instances_settle(batch_size=settings.FENCELINE["REAPER_BATCH_SIZE"], result=result)  # as resources_reap
    return result.instances_released


if __name__ == "__main__":
    main()
