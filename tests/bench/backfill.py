"""Benchmark: the operation.provider_ref backfill at scale (issue 18).

    python tests/bench/backfill.py [--operations 1000000] [--batch 5000] [--writers 2]
    make bench-backfill BENCH_ARGS="--operations 1000000"

A benchmark, not a test: pytest never collects this file. It recreates its own database
(``fenceline_bench_backfill``), migrates it, makes one real operation through the services
and copies it set-based into N version-1 operations as the old build left them (a third
with a provider id, one in a thousand UNKNOWN, one in ten thousand whose two
representations disagree), then, in one run:

1. ``--dry-run``: the whole table walked, nothing written (rows/s);
2. the backfill to 10 %, paused (``stop_after``), then resumed to the end — with
   ``--writers`` processes reporting outcomes on other operations meanwhile (dual-writes
   under the MIGRATE phase), so the figure includes the contention a live system adds;
3. the backfill run again (idempotent: it finds nothing to move; rows/s of the no-op walk).

For each: rows looked at, rows moved, conflicts opened, seconds, rows/s, batches and the
process's peak resident memory. Afterwards it checks what must hold: no operation left at
version 1 but the disagreeing ones (each with one open StateConflict), every UNKNOWN still
UNKNOWN, and every version-2 record agreeing with itself.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

DATABASE = "fenceline_bench_backfill"
ROOT = Path(__file__).resolve().parents[2]


def say(text: str) -> None:
    print(text, flush=True)


def setup_django(url: str, *, recreate: bool) -> None:
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    if recreate:
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
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seed(count: int) -> dict:
    """One operation made by the services, copied into ``count`` version-1 rows in SQL."""
    from django.core.management import call_command
    from django.db import connection

    from ledger.models import Operation, Worker
    from ledger.services.core.intent import Intent
    from ledger.services.fence import leases, operations, runs
    from ledger.services.fleet.boots import BootReport, worker_boot
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    call_command("migrate", verbosity=0)
    tenant, _ = tenant_ensure(slug="bench", name="Backfill bench")
    worker: Worker = worker_create(tenant=tenant, name="bench-worker")[0]
    # Its build reads version 2 (MIGRATE waits for every live worker to say so).
    ready = {
        d: {"ok": True, "evidence": {}} for d in ("runtime", "state", "credentials", "outbound_delivery", "admission")
    }
    worker_boot(
        worker=worker,
        report=BootReport(
            boot_id="bench-boot",
            config_hash="cfg",
            code_version="bench-2",
            state_schema_version=2,
            pid=os.getpid(),
            host="bench",
            readiness=ready,
        ),
    )
    run, _ = runs.run_create(worker=worker, schema_version=1)
    token = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="bench", ttl_s=3600).fencing_token
    template, _ = operations.operation_intend(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="email", action="send", resource="mailto:x@example.com", effect_class="IDEMPOTENT", idempotency_key="t"
        ),
    )
    columns = [f.column for f in Operation._meta.concrete_fields]
    varied = {
        "id": "gen_random_uuid()",
        "idempotency_key": "'k-' || g",
        "schema_version": "1",
        "provider_ref": "NULL",
        # a third with the provider's id; one in ten thousand disagreeing (an old build rewrote it)
        "provider_request_id": "CASE WHEN g %% 3 = 0 THEN 'ch_' || g ELSE '' END",
        "phase": "CASE WHEN g %% 1000 = 7 THEN 'UNKNOWN' ELSE o.phase END",
        "fencing_token": "CASE WHEN g %% 1000 = 7 THEN 1 ELSE o.fencing_token END",
        "dispatched_at": "CASE WHEN g %% 1000 = 7 THEN now() ELSE o.dispatched_at END",
    }
    select = ", ".join(varied.get(c, f"o.{c}") for c in columns)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        step = 200_000
        for low in range(1, count + 1, step):
            high = min(count, low + step - 1)
            cursor.execute(
                f"INSERT INTO ledger_operation ({', '.join(columns)}) SELECT {select} "
                "FROM ledger_operation o, generate_series(%s, %s) g WHERE o.id = %s",
                [low, high, template.pk],
            )
            say(f"  seeded {high:,} / {count:,} operations")
        cursor.execute(
            "UPDATE ledger_operation SET provider_ref = jsonb_build_object('provider', provider, 'id', 'other') "
            "WHERE idempotency_key IN (SELECT 'k-' || g FROM generate_series(3, %s, 30000) g)",
            [count],
        )
        disagreeing = cursor.rowcount
        Operation.objects.filter(pk=template.pk).delete()
        cursor.execute("ANALYZE ledger_operation")
    unknown = Operation.objects.filter(phase="UNKNOWN").count()
    say(f"seeded {count:,} version-1 operations in {time.perf_counter() - started:.0f} s")
    return {
        "worker_id": worker.pk,
        "run_id": str(run.pk),
        "token": token,
        "disagreeing": disagreeing,
        "unknown": unknown,
    }


def writer(url: str, worker_id: int, seconds: float, index: int, done) -> None:
    """Live traffic during the backfill: intent, authorize, dispatch and outcome on new
    operations, in a run of its own (the seeded run holds the disagreeing records, whose
    conflicts stop automation on that run, as they must)."""
    setup_django(url, recreate=False)
    from ledger.models import Worker
    from ledger.services.core.intent import Intent
    from ledger.services.fence import leases, operations, outcomes, runs

    worker = Worker.objects.get(pk=worker_id)
    run, _ = runs.run_create(worker=worker, schema_version=1)
    run_id = run.pk
    token = leases.lease_acquire(worker=worker, run_id=run_id, owner_id=f"writer-{index}", ttl_s=3600).fencing_token
    count, until = 0, time.monotonic() + seconds
    while time.monotonic() < until and not done.is_set():
        op, _ = operations.operation_intend(
            worker=worker,
            run_id=run_id,
            fencing_token=token,
            intent=Intent(
                tool="email",
                action="send",
                resource="mailto:x@example.com",
                effect_class="IDEMPOTENT",
                idempotency_key=f"live-{index}-{count}",
            ),
        )
        operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
        operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)
        outcomes.operation_report_outcome(
            worker=worker,
            operation_id=op.pk,
            fencing_token=token,
            outcome="CONFIRMED",
            provider_request_id=f"live_{count}",
        )
        count += 1


def line(label: str, progress, peak: float, before=None) -> str:
    """One phase's figures; ``before``: the progress a resumed run started from (a run's
    counters go on from where the backfill stood; its seconds are its own)."""
    scanned = progress.scanned - (before.scanned if before else 0)
    changed = progress.changed - (before.changed if before else 0)
    conflicts = progress.conflicts - (before.conflicts if before else 0)
    batches = progress.batches - (before.batches if before else 0)
    rate = scanned / progress.seconds if progress.seconds else 0.0
    return (
        f"{label:<40} {scanned:>10,} looked at {changed:>10,} moved {conflicts:>4} conflicts "
        f"{progress.seconds:>7.1f} s {rate:>10,.0f} rows/s {batches:>5} batches  peak {peak:,.0f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--operations", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--writers", type=int, default=2, help="processes writing outcomes during the backfill")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1/"))
    args = parser.parse_args(argv)
    try:
        import psycopg

        server = urlunsplit(urlsplit(args.database_url)._replace(path="/postgres"))  # any database names the server
        psycopg.connect(server, connect_timeout=3).close()
    except Exception as exc:
        print(f"PostgreSQL is not reachable at {server}: {exc}".splitlines()[0], file=sys.stderr)
        return 2

    setup_django(args.database_url, recreate=True)
    from django.db import connection

    from ledger.models import Operation, StateConflict
    from ledger.services.upgrades import provider_ref
    from ledger.services.upgrades.backfill import backfill_run
    from ledger.services.upgrades.changes import change_move
    from ledger.services.upgrades.phases import phase_forget
    from ledger.sql.upgrades import AGREES_SQL

    say(f"Backfill benchmark: {args.operations:,} operations, batches of {args.batch:,}, {args.writers} live writers")
    say(
        f"PostgreSQL {connection.cursor().connection.info.server_version}, {os.cpu_count()} CPUs, load {os.getloadavg()}"
    )
    seeded = seed(args.operations)
    name = provider_ref.CHANGE

    dry = backfill_run(name, batch_size=args.batch, dry_run=True)
    report = [line("dry run (writes nothing)", dry, peak_mb())]

    change_move(name=name, to="MIGRATE", by="bench", reason="benchmark")
    phase_forget()
    first = backfill_run(name, batch_size=args.batch, stop_after=0.10)
    report.append(line("to 10 %, then paused", first, peak_mb()))

    url = os.environ["DATABASE_URL"]
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    writers = [
        ctx.Process(
            target=writer,
            args=(url, seeded["worker_id"], 3600, i, done),
        )
        for i in range(args.writers)
    ]
    for process in writers:
        process.start()
    rest = backfill_run(name, batch_size=args.batch)
    done.set()
    for process in writers:
        process.join()
    if any(process.exitcode for process in writers):
        print("a live writer failed (its traceback is above): the figures would not be what they say", file=sys.stderr)
        return 1
    live = Operation.objects.filter(idempotency_key__startswith="live-").count()
    report.append(line(f"resumed to the end ({live:,} live writes)", rest, peak_mb(), before=first))
    again = backfill_run(name, batch_size=args.batch, restart=True)
    report.append(line("run again from the start (no-op)", again, peak_mb()))

    say("")
    for row in report:
        say(row)
    total_seconds = first.seconds + rest.seconds
    say(
        f"\nheadline: {rest.changed:,} operations moved to version 2 ({rest.scanned:,} looked at) in "
        f"{total_seconds:.1f} s = {rest.scanned / total_seconds:,.0f} rows/s, paused once, {args.writers} writers live"
    )

    # What must hold afterwards.
    left = Operation.objects.filter(schema_version=1)
    conflicts = StateConflict.objects.filter(status="OPEN")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ledger_operation o WHERE o.schema_version = 2 AND NOT {AGREES_SQL}")
        disagreeing_v2 = cursor.fetchone()[0]
    checks = {
        "left at version 1 = the disagreeing ones": left.count() == seeded["disagreeing"],
        "one open conflict per disagreeing record": conflicts.count() == seeded["disagreeing"],
        "every UNKNOWN still UNKNOWN": Operation.objects.filter(phase="UNKNOWN").count() == seeded["unknown"],
        "no version-2 record disagrees": disagreeing_v2 == 0,
        "the second run moved nothing": again.changed == 0,
    }
    for label, held in checks.items():
        say(f"  {'ok ' if held else 'FAILED'} {label}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
