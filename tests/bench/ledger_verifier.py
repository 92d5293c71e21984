"""Benchmark: the evidence ledger.

    python tests/bench/ledger_verifier.py [--events N] [--append-seconds S] [--workers W]
    make bench-ledger BENCH_ARGS="--events 1000000"

A benchmark, not a test (pytest never collects it). In its own database
(``fenceline_bench_ledger``, dropped and recreated each run) it measures, in one process
and one run:

1. verify: one run of N events (default 1,000,000; hashed and linked exactly as the app
   does, written with COPY) verified by the in-app verifier, streaming from PostgreSQL
   (``run_verify``, no sealing), as events per second; and the peak memory it added;
2. bare: SHA-256 (hashlib) over the same canonical bytes, rebuilt from the same rows in
   chunks, timing only the hashing — the ratio verify / bare is the headline figure;
3. append (one run): NOTE events appended through the service (``event_append``: fence,
   boundary, hash, INSERT, head UPDATE in one transaction) for S seconds by one process;
4. append (many runs): W processes appending to W runs for S seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing as mp
import os
import resource
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import (  # noqa: E402
    BenchError,
    Server,
    django_setup,
    recreate_database,
)

DATABASE = "fenceline_bench_ledger"
COPY_CHUNK = 50_000


def say(line: str = "") -> None:
    print(line, flush=True)


def seed_chain(run, events: int, actor: str) -> None:
    """Append NOTE events to ``run`` with COPY until its chain holds ``events`` events,
    chained and signed exactly as build_event does (continuing from the run's head)."""
    from django.db import connection

    from ledger.chain import canonical_bytes, format_time, hash_bytes
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
            buffer = io.StringIO()
            for seq in range(seq + 1, min(seq + COPY_CHUNK, events) + 1):  # noqa: B020 - seq resumes where the chunk ended
                event_id = str(uuid.uuid4())
                occurred = start + timedelta(microseconds=seq * 1000)
                fields = {"step": seq, "note": "checked the deployment status"}
                digest = hash_bytes(
                    canonical_bytes(
                        run_id=run_id,
                        seq=seq,
                        event_id=event_id,
                        type="NOTE",
                        schema_version=1,
                        actor=actor,
                        occurred_at=format_time(occurred),
                        fields=fields,
                        prev_hash=prev,
                    )
                )
                buffer.write(
                    "\t".join(
                        [
                            run_id,
                            str(seq),
                            event_id,
                            "NOTE",
                            actor,
                            occurred.isoformat(),
                            json.dumps(fields),
                            prev,
                            digest,
                            signer.key_id,
                            signer.mac(run_id=run_id, seq=seq, hash=digest),
                            "1",
                        ]
                    )
                    + "\n"
                )
                prev = digest
            with raw.copy(
                "COPY ledger_event (run_id, seq, event_id, type, actor, occurred_at, fields, prev_hash, hash, mac_key_id, mac, "
                "schema_version) FROM STDIN"
            ) as copy:
                copy.write(buffer.getvalue())
            rate = seq / max(time.monotonic() - started, 1e-9)
            print(f"\r  seeded {seq:,}/{events:,} events ({rate:,.0f}/s)", end="", flush=True)
    print()
    Run.objects.filter(pk=run.pk).update(last_seq=events, last_hash=prev)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE ledger_event")


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
    total = sum(results.get(timeout=seconds + 60) for _ in procs)
    for proc in procs:
        proc.join(30)
    return total / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--append-seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
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

    from ledger.services.evidence.verification import run_verify
    from ledger.services.fence import leases, runs
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    say(f"migrating {DATABASE} ...")
    call_command("migrate", verbosity=0)
    tenant, _ = tenant_ensure(slug="bench")
    worker, _ = worker_create(tenant=tenant, name="bench-worker")
    run, _ = runs.run_create(worker=worker, schema_version=1)
    leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="bench", ttl_s=3600)
    big, _ = runs.run_create(worker=worker, schema_version=1, external_id="big")

    say(f"seeding one run with {args.events:,} events (COPY) ...")
    seed_chain(big, args.events, actor="worker:bench-worker/bench")

    say("verifying it (in-app verifier, streaming from PostgreSQL) ...")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    report = run_verify(run_id=big.pk, seal=False, on_events=lambda n: print(f"\r  {n:,} events", end="", flush=True))
    verify_s = time.perf_counter() - t0
    print()
    rss_added_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    if report.events_checked != args.events or report.finding is not None:
        print(f"bench: the seeded chain did not verify: {report.summary()}", file=sys.stderr)
        return 1

    say("bare SHA-256 over the same canonical bytes ...")
    hash_s, hashed = bare_hash_seconds(big)

    say(f"appending for {args.append_seconds:.0f}s: one run, one process ...")
    one = append_rate(url, worker, [str(run.pk)], args.append_seconds)
    say(f"appending for {args.append_seconds:.0f}s: {args.workers} runs, {args.workers} processes ...")
    many_runs = []
    for _ in range(args.workers):
        r, _ = runs.run_create(worker=worker, schema_version=1)
        leases.lease_acquire(worker=worker, run_id=r.pk, owner_id="bench", ttl_s=3600)
        many_runs.append(str(r.pk))
    many = append_rate(url, worker, many_runs, args.append_seconds)

    verify_rate = args.events / verify_s
    bare_rate = hashed / hash_s
    say()
    say(f"machine: {os.cpu_count()} cores; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load {os.getloadavg()[0]:.2f}")
    say(f"{'measure':<46} {'value':>16}")
    say(f"{'events verified (in-app, from PostgreSQL)':<46} {args.events:>16,}")
    say(f"{'verify time':<46} {verify_s:>15.1f}s")
    say(f"{'verified events / s':<46} {verify_rate:>16,.0f}")
    say(f"{'bare hashlib SHA-256 / s (same bytes)':<46} {bare_rate:>16,.0f}")
    say(f"{'ratio verify / bare':<46} {verify_rate / bare_rate:>16.3f}")
    say(f"{'peak memory added by the verifier':<46} {rss_added_mb:>14.0f}MB")
    say(f"{'appends / s, one run, one process':<46} {one:>16,.0f}")
    say(f"{f'appends / s, {args.workers} runs, {args.workers} processes':<46} {many:>16,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
