"""Benchmark: the evidence ledger.

    python tests/bench/ledger_verifier.py [--events N] [--append-seconds S] [--workers W]
        [--parallel-runs P] [--verify-processes K] [--scale-events T] [--scale-run-events R]
    make bench-ledger BENCH_ARGS="--events 1000000"

A benchmark, not a test (pytest never collects it). In its own database
(``fenceline_bench_ledger``, dropped and recreated each run) it measures, in one run:

1. append (one run): NOTE events appended through the service (``event_append``: fence,
   boundary, hash, INSERT, head UPDATE in one transaction) for S seconds by one process,
   on the empty table;
2. append (many runs): W processes appending to W runs for S seconds, on the empty table;
3. verify: one run of N events (default 1,000,000; hashed and linked exactly as the app
   does, written with COPY) verified by the in-app verifier, streaming from PostgreSQL
   (``run_verify``, no sealing), as events per second; and the memory it added, at a tenth
   of the events and at the end (bounded: the same at both);
4. read only: the same rows read by the same process the way the verifier reads them
   (``event_rows``), doing nothing else — verify / read is the headline figure;
5. bare: SHA-256 (hashlib) over the same canonical bytes, rebuilt from the same rows in
   chunks, timing only the hashing — verify / bare, the figure of the design brief;
6. parallel: P runs of N / P events each, verified by one process, then by K processes at
   once (each its share of the runs): the speedup;
7. append (many runs) at scale: events COPYed (as in 3, over runs of R events) until the
   table holds T (default 10,000,000), then phase 2 again: the rate, and its ratio to the
   empty table's. Each append phase starts from a CHECKPOINT, so that both pay the same
   full-page writes. Beside the rates (which other work on the machine moves), what each
   append cost the indexes of ledger_event: their pages read from outside shared buffers,
   counted in this database alone; and the WAL's full-page images, counted for the whole
   server (other databases' writes included).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import resource
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import (  # noqa: E402
    BackendCpu,
    BenchError,
    Server,
    ServerStats,
    django_setup,
    recreate_database,
)

DATABASE = "fenceline_bench_ledger"
COPY_CHUNK = 50_000
COPY_WRITE = 1000  # rows per write into a COPY
NOTE = "checked the deployment status"


def say(line: str = "") -> None:
    print(line, flush=True)


def seed_chain(run, events: int, actor: str, *, progress: bool = True, analyze: bool = True) -> None:
    """Append NOTE events to ``run`` with COPY until its chain holds ``events`` events,
    chained and signed exactly as build_event does (continuing from the run's head), with
    event ids made as build_event makes them."""
    from django.db import connection

    from ledger.chain import canonical_bytes, format_time, hash_bytes
    from ledger.ids import uuid7
    from ledger.models import Run
    from ledger.services.evidence.append import event_signer

    signer = event_signer()

    run_id = str(run.pk)
    prev = run.last_hash
    start = datetime(2026, 12, 1, tzinfo=UTC)
    started = time.monotonic()
    seq = run.last_seq
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg cursor, for COPY
        while seq < events:
            # One COPY per chunk, its rows sent as they are made: PostgreSQL stores them meanwhile.
            with raw.copy(
                "COPY ledger_event (run_id, seq, event_id, type, actor, occurred_at, fields, prev_hash, hash, mac_key_id, mac, "
                "schema_version) FROM STDIN"
            ) as copy:
                lines = []
                for seq in range(seq + 1, min(seq + COPY_CHUNK, events) + 1):  # noqa: B020 - seq resumes where the chunk ended
                    event_id = str(uuid7())
                    occurred = format_time(start + timedelta(microseconds=seq * 1000))  # PostgreSQL reads it too
                    fields = {"step": seq, "note": NOTE}
                    digest = hash_bytes(
                        canonical_bytes(
                            run_id=run_id,
                            seq=seq,
                            event_id=event_id,
                            type="NOTE",
                            schema_version=1,
                            actor=actor,
                            occurred_at=occurred,
                            fields=fields,
                            prev_hash=prev,
                        )
                    )
                    mac = signer.mac(run_id=run_id, seq=seq, hash=digest)
                    stored = f'{{"step": {seq}, "note": "{NOTE}"}}'  # json.dumps(fields)
                    lines.append(
                        f"{run_id}\t{seq}\t{event_id}\tNOTE\t{actor}\t{occurred}\t{stored}\t{prev}\t{digest}\t"
                        f"{signer.key_id}\t{mac}\t1\n"
                    )
                    prev = digest
                    if len(lines) == COPY_WRITE:
                        copy.write("".join(lines))
                        lines.clear()
                copy.write("".join(lines))
            if progress:
                rate = seq / max(time.monotonic() - started, 1e-9)
                print(f"\r  seeded {seq:,}/{events:,} events ({rate:,.0f}/s)", end="", flush=True)
    if progress:
        print()
    Run.objects.filter(pk=run.pk).update(last_seq=events, last_hash=prev)
    if analyze:
        vacuum_analyze()


def vacuum_analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE ledger_event")
        cursor.execute("VACUUM ANALYZE ledger_run")


def checkpoint() -> None:
    """Write out every dirty page now: the phase after it pays its full-page writes afresh."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")


def events_in_table() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ledger_event")
        return cursor.fetchone()[0]


def rss_mb() -> float:
    """This process's resident memory now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def bare_hash_seconds(run) -> tuple[float, int]:
    """Time SHA-256 alone over the canonical bytes of the run's events (built untimed)."""
    from ledger.chain import canonical_bytes, format_time
    from ledger.models import Event

    columns = ("seq", "event_id", "type", "schema_version", "actor", "occurred_at", "fields", "prev_hash")
    rows = Event.objects.filter(run=run).order_by("seq").values_list(*columns).iterator(chunk_size=5000)
    run_id = str(run.pk)
    hashing = 0.0
    count = 0
    chunk: list[bytes] = []

    def flush() -> float:
        sha256 = hashlib.sha256
        t0 = time.perf_counter()
        for data in chunk:
            sha256(data).hexdigest()
        return time.perf_counter() - t0

    for seq, event_id, type_, version, actor, occurred, fields, prev in rows:
        chunk.append(
            canonical_bytes(
                run_id=run_id,
                seq=seq,
                event_id=str(event_id),
                type=type_,
                schema_version=version,
                actor=actor,
                occurred_at=format_time(occurred),
                fields=fields,
                prev_hash=prev,
            )
        )
        if len(chunk) == 50_000:
            hashing += flush()
            count += len(chunk)
            chunk.clear()
    hashing += flush()
    count += len(chunk)
    return hashing, count


def read_only_seconds(run) -> tuple[float, int]:
    """Read the run's rows exactly as run_verify reads them (``event_rows``), nothing else."""
    from ledger.services.evidence.verification import event_rows

    count = 0
    t0 = time.perf_counter()
    with event_rows(run_id=run.pk, upto=run.last_seq) as batches:
        for batch in batches:
            for _ in batch:
                count += 1
    return time.perf_counter() - t0, count


def verify_loop(database_url: str, run_ids: list[str], start_at: float, results) -> None:
    django_setup(database_url)
    from ledger.services.evidence.verification import run_verify

    while time.time() < start_at:
        time.sleep(0.001)
    events = 0
    for run_id in run_ids:
        report = run_verify(run_id=run_id, seal=False)
        if report.finding is not None:
            results.put((0, time.time(), report.summary()))
            return
        events += report.events_checked
    results.put((events, time.time(), ""))


@dataclass
class VerifyPhase:
    """Runs verified by some processes at once: the rate; the CPU the verifiers and their
    PostgreSQL backends spent per event (the same in one process and in several: nothing
    serializes them); and the cores they kept busy, beside those the rest of the machine
    kept busy meanwhile (what the processes could not have)."""

    rate: float
    cpu_us_per_event: float
    cores: float
    others_cores: float


def machine_busy_seconds() -> float:
    """CPU seconds all the machine's cores have been busy since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def collect(results, procs: list) -> list:
    """One result from each process; a process that died without one stops the bench."""
    import queue

    done: list = []
    while len(done) < len(procs):
        try:
            done.append(results.get(timeout=1.0))
        except queue.Empty:
            if sum(proc.exitcode is not None for proc in procs) > len(done):
                try:  # a last result may have been on its way
                    done.append(results.get(timeout=2.0))
                except queue.Empty:
                    raise BenchError("a benchmark process died without a result (its traceback is above)") from None
    return done


def verify_rate(database_url: str, run_ids: list[str], processes: int) -> VerifyPhase:
    """``processes`` processes verifying ``run_ids`` at once, each its share (one process:
    all of them, one after another)."""
    from django.db import connections

    connections.close_all()
    results: mp.Queue = mp.Queue()
    start_at = time.time() + 1.0
    shares = [run_ids[i::processes] for i in range(processes)]
    procs = [
        mp.get_context("fork").Process(target=verify_loop, args=(database_url, share, start_at, results))
        for share in shares
    ]
    backends = BackendCpu(DATABASE)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    for proc in procs:
        proc.start()
    while time.time() < start_at:
        time.sleep(0.001)
    backends.start()
    machine = machine_busy_seconds()
    done = collect(results, procs)
    machine = machine_busy_seconds() - machine
    backend_s = backends.stop() or 0.0
    for proc in procs:
        proc.join(30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    problems = [problem for _, _, problem in done if problem]
    if problems:
        raise BenchError(f"a seeded chain did not verify: {problems[0]}")
    events = sum(count for count, _, _ in done)
    wall = max(finished for _, finished, _ in done) - start_at
    # The children's CPU includes their start-up before start_at (a Django setup each).
    ours = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime + backend_s
    return VerifyPhase(events / wall, ours / events * 1e6, ours / wall, max(machine - ours, 0.0) / wall)


def seed_runs(worker, runs: int, events_each: int, actor: str) -> list:
    """``runs`` new runs of ``events_each`` events each (their RUN_CREATED among them)."""
    from ledger.models import Run
    from ledger.services.fence import runs as run_services

    made = []
    started = time.monotonic()
    for n in range(runs):
        run, _ = run_services.run_create(worker=worker, schema_version=1)
        seed_chain(Run.objects.get(pk=run.pk), events_each, actor, progress=False, analyze=False)
        made.append(run)
        if n % 10 == 9 or n == runs - 1:
            rate = (n + 1) * events_each / max(time.monotonic() - started, 1e-9)
            print(
                f"\r  seeded {n + 1:,}/{runs:,} runs of {events_each:,} events ({rate:,.0f} events/s)",
                end="",
                flush=True,
            )
    print()
    vacuum_analyze()
    return made


def append_loop(database_url: str, worker_pk: int, run_id: str, seconds: float, start_at: float, results) -> None:
    django_setup(database_url)
    from ledger.models import Worker
    from ledger.services.fence.notes import event_append

    worker = Worker.objects.select_related("tenant").get(pk=worker_pk)
    while time.time() < start_at:
        time.sleep(0.001)
    count = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        event_append(worker=worker, run_id=run_id, fencing_token=1, type="NOTE", fields={"n": count})
        count += 1
    results.put(count)


def append_rate(database_url: str, worker, runs: list[str], seconds: float) -> float:
    from django.db import connections

    connections.close_all()
    results: mp.Queue = mp.Queue()
    start_at = time.time() + 1.0
    procs = [
        mp.get_context("fork").Process(
            target=append_loop, args=(database_url, worker.pk, run_id, seconds, start_at, results)
        )
        for run_id in runs
    ]
    for proc in procs:
        proc.start()
    total = sum(collect(results, procs))
    for proc in procs:
        proc.join(30)
    return total / seconds


@dataclass
class AppendPhase:
    """An append phase: its rate, and what its INSERTs cost the indexes of ledger_event: the
    index pages read from outside shared buffers per append (an index whose inserts land
    all over it reads about one per append once it outgrows them), and the full-page
    images per append that the whole server wrote to the WAL (other databases' too)."""

    rate: float
    reads: dict[str, float]
    fpi: float


def io_counters() -> tuple[dict[str, int], int]:
    """ledger_event's index pages read from outside shared buffers, by index, and the
    server's full-page images so far."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT indexrelname, idx_blks_read FROM pg_statio_user_indexes WHERE relname = 'ledger_event'")
        reads = dict(cursor.fetchall())
        cursor.execute("SELECT wal_fpi FROM pg_stat_wal")
        return reads, cursor.fetchone()[0]


def append_phase(server: Server, database_url: str, worker, runs: list[str], seconds: float) -> AppendPhase:
    """append_rate after a CHECKPOINT (so that every phase pays its full-page writes
    afresh), with the I/O counters read before and after (once the appenders are gone)."""
    checkpoint()
    reads_before, fpi_before = io_counters()
    rate = append_rate(database_url, worker, runs, seconds)
    ServerStats(server, DATABASE).wait_for_clients_gone()
    reads_after, fpi_after = io_counters()
    appends = max(rate * seconds, 1)
    reads = {name: (count - reads_before.get(name, 0)) / appends for name, count in reads_after.items()}
    return AppendPhase(rate, reads, (fpi_after - fpi_before) / appends)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--append-seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--parallel-runs", type=int, default=4, help="runs verified at once (0: skip the phase)")
    parser.add_argument("--verify-processes", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--scale-events", type=int, default=10_000_000, help="events in the table for the last phase (0: skip)"
    )
    parser.add_argument("--scale-run-events", type=int, default=10_000, help="events per run seeded for it")
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    args = parser.parse_args(argv)
    try:
        server = Server(args.database_url)
        recreate_database(server, DATABASE)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    url = server.url_for(DATABASE)
    django_setup(url)
    from django.core.management import call_command

    from ledger.services.evidence.verification import PROGRESS_EVERY, run_verify
    from ledger.services.fence import leases, runs
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    actor = "worker:bench-worker/bench"
    loads = [os.getloadavg()[0]]
    say(f"migrating {DATABASE} ...")
    call_command("migrate", verbosity=0)
    tenant, _ = tenant_ensure(slug="bench")
    worker, _ = worker_create(tenant=tenant, name="bench-worker")

    def leased_runs(count: int) -> list[str]:
        made = []
        for _ in range(count):
            run, _ = runs.run_create(worker=worker, schema_version=1)
            leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="bench", ttl_s=3600)
            made.append(str(run.pk))
        return made

    say(f"appending for {args.append_seconds:.0f}s on the empty table: one run, one process ...")
    one = append_phase(server, url, worker, leased_runs(1), args.append_seconds)
    say(
        f"appending for {args.append_seconds:.0f}s on the empty table: {args.workers} runs, {args.workers} processes ..."
    )
    many_empty = append_phase(server, url, worker, leased_runs(args.workers), args.append_seconds)
    loads.append(os.getloadavg()[0])

    big, _ = runs.run_create(worker=worker, schema_version=1, external_id="big")
    say(f"seeding one run with {args.events:,} events (COPY) ...")
    seed_chain(big, args.events, actor=actor)
    big.refresh_from_db()

    say("verifying it (in-app verifier, streaming from PostgreSQL) ...")
    rss_start = rss_mb()
    rss_seen: dict[str, float] = {"tenth": 0.0, "peak": 0.0}

    def progress(n: int) -> None:
        rss_seen["peak"] = max(rss_seen["peak"], rss_mb())
        if n <= max(args.events // 10, PROGRESS_EVERY):
            rss_seen["tenth"] = rss_seen["peak"]
        print(f"\r  {n:,} events", end="", flush=True)

    t0 = time.perf_counter()
    report = run_verify(run_id=big.pk, seal=False, on_events=progress)
    verify_s = time.perf_counter() - t0
    print()
    rss_seen["peak"] = max(rss_seen["peak"], rss_mb())
    if report.events_checked != args.events or report.finding is not None:
        print(f"bench: the seeded chain did not verify: {report.summary()}", file=sys.stderr)
        return 1
    loads.append(os.getloadavg()[0])

    say("reading the same rows the way the verifier reads them, doing nothing else ...")
    read_s, read = read_only_seconds(big)

    say("bare SHA-256 over the same canonical bytes ...")
    hash_s, hashed = bare_hash_seconds(big)
    loads.append(os.getloadavg()[0])

    one_process = many_processes = None
    if args.parallel_runs:
        each = max(args.events // args.parallel_runs, 1)
        say(f"seeding {args.parallel_runs} runs of {each:,} events (COPY) ...")
        parallel = [str(run.pk) for run in seed_runs(worker, args.parallel_runs, each, actor)]
        say(f"verifying them in one process, then in {args.verify_processes} processes at once ...")
        try:
            one_process = verify_rate(url, parallel, 1)
            many_processes = verify_rate(url, parallel, args.verify_processes)
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        loads.append(os.getloadavg()[0])

    many_full = None
    table_events = events_in_table()
    if args.scale_events:
        missing = max(args.scale_events - table_events, 0)
        scale_runs = -(-missing // args.scale_run_events)
        if scale_runs:
            say(f"seeding {scale_runs:,} runs of {args.scale_run_events:,} events (COPY) ...")
            seed_runs(worker, scale_runs, args.scale_run_events, actor)
        table_events = events_in_table()
        say(
            f"appending for {args.append_seconds:.0f}s with {table_events:,} events in the table: "
            f"{args.workers} runs, {args.workers} processes ..."
        )
        many_full = append_phase(server, url, worker, leased_runs(args.workers), args.append_seconds)
        loads.append(os.getloadavg()[0])

    verify_per_s = args.events / verify_s
    read_per_s = read / read_s
    bare_per_s = hashed / hash_s
    say()
    say(
        f"machine: {os.cpu_count()} cores; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"1-min load at the phases: {', '.join(f'{load:.2f}' for load in loads)}"
    )
    say(f"{'measure':<52} {'value':>16}")
    say(f"{'events verified (in-app, from PostgreSQL)':<52} {args.events:>16,}")
    say(f"{'verify time':<52} {verify_s:>15.1f}s")
    say(f"{'verified events / s':<52} {verify_per_s:>16,.0f}")
    say(f"{'read only events / s (same rows, same reader)':<52} {read_per_s:>16,.0f}")
    say(f"{'ratio verify / read':<52} {verify_per_s / read_per_s:>16.3f}")
    say(f"{'bare hashlib SHA-256 / s (same bytes)':<52} {bare_per_s:>16,.0f}")
    say(f"{'ratio verify / bare':<52} {verify_per_s / bare_per_s:>16.3f}")
    say(f"{'memory added by the verifier, at 1/10 of the events':<52} {rss_seen['tenth'] - rss_start:>14.1f}MB")
    say(f"{'memory added by the verifier, peak (all events)':<52} {rss_seen['peak'] - rss_start:>14.1f}MB")
    if one_process is not None and many_processes is not None:
        for count, phase in ((1, one_process), (args.verify_processes, many_processes)):
            label = f"verified events / s, {args.parallel_runs} runs, {count} process{'es' if count > 1 else ''}"
            say(f"{label:<52} {phase.rate:>16,.0f}")
            say(
                f"  CPU per event (verifiers + their backends) {phase.cpu_us_per_event:.1f} us; cores busy: "
                f"theirs {phase.cores:.2f}, the rest of the machine's {phase.others_cores:.2f}"
            )
        say(f"{'speedup, processes / one':<52} {many_processes.rate / one_process.rate:>16.2f}")
    phases = [("one run, one process, empty table", one)]
    phases.append((f"{args.workers} runs, {args.workers} processes, empty table", many_empty))
    if many_full is not None:
        phases.append((f"{args.workers} runs, {args.workers} processes, {table_events / 1e6:.1f}M events", many_full))
    for label, phase in phases:
        say(f"{'appends / s, ' + label:<52} {phase.rate:>16,.0f}")
    if many_full is not None:
        say(f"{'ratio full table / empty table':<52} {many_full.rate / many_empty.rate:>16.3f}")
    say("per append, in the append phases above, in order:")
    for name in sorted(many_empty.reads):
        figures = ", ".join(f"{phase.reads.get(name, 0.0):.3f}" for _, phase in phases)
        say(f"  {'index pages read, ' + name:<50} {figures:>16}")
    say(f"  {'WAL full-page images (whole server)':<50} {', '.join(f'{phase.fpi:.2f}' for _, phase in phases):>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
