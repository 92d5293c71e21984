"""Benchmark: the set-based sweeps of what runs leave behind (issue 12).

    python tests/bench/reapers.py [--items 100000]
    make bench-reapers BENCH_ARGS="--items 100000"

A benchmark, not a test: pytest never collects this file. It recreates its own database
(``fenceline_bench_reapers``), migrates it, and bulk-inserts the rows the services would
have written (a tenant, a worker, runs with their lease and instance), then times three
sweeps, one after the other, each to the end of its backlog:

1. ``leases_reap``: N runs whose lease expired (no operation in flight) -> each lease ends
   (LEASE_EXPIRED), its instance EXPIRED;
2. ``instances_settle`` (the resource reaper's instance pass): those N EXPIRED instances ->
   REAPING -> RELEASED (no resource open);
3. ``resources_reap``: N ACTIVE resources past their deadline (ten per run, on N/10 runs with
   a live lease), closed by the sandbox driver, which answers at once -> RELEASE_REQUESTED
   -> RELEASING -> RELEASED, one RESOURCE_RELEASED event each.

For each sweep: items per second, SQL statements per item (every statement Django sends,
counted by an execute wrapper), and the process's peak resident set (ru_maxrss, for the
whole run so far). ``--trace-memory`` adds tracemalloc's peak Python memory per sweep; it
slows Python several times, so its run's items/s are not the figures to quote.
"""

from __future__ import annotations

import argparse
import os
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
TRACE_MEMORY = False  # --trace-memory: tracemalloc's peak, at the cost of a slower Python
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
    chunk = 5000

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
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


class Counter:
    def __init__(self) -> None:
        self.statements = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        return execute(sql, params, many, context)


def measure(name: str, items: int, fn) -> dict:
    from django.db import connection

    counter = Counter()
    if TRACE_MEMORY:
        tracemalloc.start()
    started = time.perf_counter()
    with connection.execute_wrapper(counter):
        done = fn()
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if TRACE_MEMORY else 0
    tracemalloc.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {
        "sweep": name,
        "items": done,
        "seconds": seconds,
        "per_s": done / seconds if seconds else 0,
        "statements_per_item": counter.statements / done if done else 0,
        "peak_python_mb": peak / 2**20,
        "max_rss_mb": rss_mb,
    }
    traced = f"; peak Python memory {row['peak_python_mb']:.1f} MB" if TRACE_MEMORY else ""
    say(
        f"[{name}] {done:,} items in {seconds:.1f} s = {row['per_s']:,.0f}/s; "
        f"{row['statements_per_item']:.3f} statements per item{traced}; max RSS so far {rss_mb:.0f} MB"
    )
    if done != items:
        say(f"[{name}] WARNING: expected {items:,} items")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000, help="expired leases, and expired resources (100000)")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1/"))
    parser.add_argument(
        "--trace-memory", action="store_true", help="peak Python memory (tracemalloc; slows the sweeps)"
    )
    args = parser.parse_args()
    global TRACE_MEMORY
    TRACE_MEMORY = args.trace_memory
    setup_django(args.database_url)
    seed(args.items)

    from ledger.services.fence.leases import leases_reap
    from ledger.services.lifespan.reaper import ResourceReapResult, instances_settle, resources_reap

    rows = [
        measure("leases_reap", args.items, lambda: leases_reap().leases),
        measure(
            "instances_settle",
            args.items,
            lambda: _settled(instances_settle, ResourceReapResult),
        ),
        measure("resources_reap", args.items, lambda: resources_reap().released),
    ]
    say("")
    say(f"{'sweep':<18}{'items':>10}{'items/s':>10}{'stmts/item':>12}{'peak MB':>10}{'max RSS MB':>12}")
    for row in rows:
        say(
            f"{row['sweep']:<18}{row['items']:>10,}{row['per_s']:>10,.0f}{row['statements_per_item']:>12.3f}"
            f"{(format(row['peak_python_mb'], '.1f') if TRACE_MEMORY else '-'):>10}{row['max_rss_mb']:>12.0f}"
        )


def _settled(instances_settle, result_type) -> int:
    from django.conf import settings

    result = result_type()
    instances_settle(batch_size=settings.FENCELINE["RESOURCE_REAPER_BATCH_SIZE"], result=result)
    return result.instances_released


if __name__ == "__main__":
    main()
