"""Benchmark: the diagnostic plane (docs/architecture.md, "Data planes").

    python tests/bench/retention.py --database-url postgres://.../DB [--events N] [--payloads P]

A benchmark, not a test (pytest never collects it). It migrates the database it is given
(nothing is dropped; its rows go to a new tenant named bench-planes-<random>) and measures,
one process each:

1. append: N worker events through the service (``event_append``: fence, boundary, hash,
   INSERT, head UPDATE in one transaction) without a payload, then N with a 1 KB payload
   (the event of schema version 2 plus its DiagnosticPayload row): events per second;
2. verify: the in-app verifier (``run_verify``, no sealing) over each of the two runs: the
   cost of the payload pass (every payload read back and hashed against its digest);
3. retention: P payload rows written "40 days ago" (one INSERT ... SELECT), then
   ``retention_apply`` (batches of FENCELINE_RETENTION_BATCH_SIZE): payloads removed per
   second; then a second run, which finds nothing (idempotent), and the chain still verifies.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import django_setup  # noqa: E402

STDERR = "Traceback (most recent call last): ... TimeoutError: the provider did not answer in 30 s\n" * 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), required=False)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--payloads", type=int, default=100_000)
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url (or DATABASE_URL) is required")
    django_setup(args.database_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    run_bench(args.events, args.payloads)


def run_bench(events: int, payloads: int) -> None:
    from django.db import connection
    from django.utils import timezone

    from ledger.models import DiagnosticPayload
    from ledger.services.evidence.retention import retention_apply
    from ledger.services.evidence.verification import run_verify
    from ledger.services.fence.leases import lease_acquire
    from ledger.services.fence.notes import event_append
    from ledger.services.fence.runs import run_create
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    tenant, _ = tenant_ensure(slug=f"bench-planes-{secrets.token_hex(3)}")
    worker, _ = worker_create(tenant=tenant, name="bench")
    print(f"tenant {tenant.slug}; {events:,} events per run, {payloads:,} payloads to remove", flush=True)

    runs = {}
    for label, payload in (("no payload", None), ("1 KB payload", {"stderr": STDERR[:1024], "attempt": 1})):
        run, _ = run_create(worker=worker, schema_version=1)
        token = lease_acquire(worker=worker, run_id=run.pk, owner_id="bench", ttl_s=3600).fencing_token
        started = time.perf_counter()
        for n in range(events):
            event_append(
                worker=worker, run_id=run.pk, fencing_token=token, type="x.step", fields={"n": n}, payload=payload
            )
        elapsed = time.perf_counter() - started
        runs[label] = run
        print(f"append, {label}: {events / elapsed:,.0f} events/s ({elapsed:.2f} s)", flush=True)

    for label, run in runs.items():
        started = time.perf_counter()
        report = run_verify(run_id=run.pk, seal=False)
        elapsed = time.perf_counter() - started
        print(
            f"verify, {label}: {report.events_checked / elapsed:,.0f} events/s ({elapsed:.2f} s; "
            f"{report.status}, {report.payloads_checked:,} payloads checked)",
            flush=True,
        )

    run = runs["1 KB payload"]
    table = connection.ops.quote_name(DiagnosticPayload._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (schema_version, tenant_id, run_id, seq, klass, digest, body, size, created_at) "
            "SELECT 1, %s, %s, 1000000 + g, 'event_payload', 'sha256:' || md5(g::text), "
            "jsonb_build_object('stderr', %s::text), 1024, now() - interval '40 days' FROM generate_series(1, %s) g",
            [tenant.pk, run.pk, STDERR[:1024], payloads],
        )
        cursor.execute("ANALYZE " + table)
    started = time.perf_counter()
    result = retention_apply(now=timezone.now())
    elapsed = time.perf_counter() - started
    print(f"retention: {result.removed:,} payloads removed, {result.removed / elapsed:,.0f}/s ({elapsed:.2f} s)")
    started = time.perf_counter()
    again = retention_apply()
    print(f"retention again: {again.removed} removed ({time.perf_counter() - started:.3f} s)")
    report = run_verify(run_id=run.pk, seal=False)
    print(f"the run after retention: {report.status}, finding {report.finding}")


if __name__ == "__main__":
    main()
