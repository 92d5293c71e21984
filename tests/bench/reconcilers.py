"""Benchmark: automatic reconciliations per second against the sandbox provider (issue 14).

    python tests/bench/reconcilers.py [--items 2000] [--concurrency 8]
    make bench-reconcilers BENCH_ARGS="--items 2000"

A benchmark, not a test: pytest never collects this file. It recreates its own database
(``fenceline_bench_reconcilers``), starts the sandbox provider in-process, and makes N
UNKNOWN operations through the real services (intend, authorize, dispatch, outcome UNKNOWN),
half of them charged at the provider first. Their cases open in LOOKUP. Then, in one run:

1. the yardstick: the same N lookups as bare HTTP GETs to the sandbox, from a thread pool
   of the same size the job uses;
2. the job: ``cases_look_up`` passes until none is due — each claims a batch with SKIP
   LOCKED, asks the sandbox, and settles every case under its run lock (RECONCILED by
   ``reconciler:sandbox-payments`` with the charge id, or as not happened), with a
   CASE_LOOKED_UP and an OPERATION_RECONCILED event each.

It prints reconciliations per second, the ratio to the bare lookups, and SQL statements per
reconciliation.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import reapers

reapers.DATABASE = "fenceline_bench_reconcilers"


def seed(items: int, provider) -> list[str]:
    import requests
    from django.db import connection
    from django.utils import timezone

    from approvals.models import ReconciliationCase
    from ledger.services.core.intent import Intent
    from ledger.services.fence import leases, operations, outcomes, runs
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    tenant, _ = tenant_ensure(slug="bench")
    worker, _ = worker_create(tenant=tenant, name="bench-worker")
    keys = []
    per_run = 50
    for start in range(0, items, per_run):
        run, _ = runs.run_create(worker=worker, schema_version=1)
        token = leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="bench", ttl_s=3600).fencing_token
        for n in range(start, min(items, start + per_run)):
            key = f"bench-charge-{n}"
            intent = Intent(
                tool="payments",
                action="charge",
                resource=f"customer:{n}",
                effect_class="NON_RETRYABLE",
                idempotency_key=key,
                provider="sandbox-payments",
            )
            op, _ = operations.operation_intend(worker=worker, run_id=run.pk, fencing_token=token, intent=intent)
            operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
            operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)
            if n % 2 == 0:
                requests.post(
                    provider.url + "/v1/charges",
                    headers={"Idempotency-Key": key},
                    json={"amount_cents": 100},
                    timeout=5,
                )
            outcomes.operation_report_outcome(worker=worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
            keys.append(key)
        reapers.say(f"[seed] {len(keys):,} / {items:,} UNKNOWN operations")
    ReconciliationCase.objects.update(next_lookup_at=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return keys


def bare_lookups(provider, keys: list[str], concurrency: int) -> float:
    import requests

    session = requests.Session()

    def ask(key: str) -> int:
        return session.get(provider.url + "/v1/charges", params={"idempotency_key": key}, timeout=5).status_code

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(ask, keys))
    return len(keys) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args()
    import os

    reapers.setup_django(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/fenceline"))
    from django.conf import settings
    from django.test import override_settings

    from approvals.models import ReconciliationCase
    from approvals.services.lookups import LookupPass, cases_look_up
    from console.simulation.provider import SandboxProvider
    from ledger.services.reconciliation.http import HttpReconciler
    from ledger.services.reconciliation.registry import register

    provider = SandboxProvider().start()
    config = {k: v for k, v in settings.FENCELINE["RECONCILERS"]["sandbox-payments"].items() if k != "provider"}
    register("sandbox-payments", HttpReconciler("sandbox-payments", {**config, "base_url": provider.url}), provider="x")
    keys = seed(args.items, provider)
    bare = bare_lookups(provider, keys, args.concurrency)
    reapers.say(f"[bare lookups] {bare:,.0f}/s (HTTP GET by key, {args.concurrency} threads)")

    counter = reapers.Counter()
    total = LookupPass()
    from django.db import connection

    with override_settings(FENCELINE={**settings.FENCELINE, "RECONCILE_CONCURRENCY": args.concurrency}):
        started = time.perf_counter()
        with connection.execute_wrapper(counter):
            while (result := cases_look_up(batch_size=args.batch_size)).claimed:
                total.happened += result.happened
                total.did_not_happen += result.did_not_happen
                total.to_people += result.to_people
        seconds = time.perf_counter() - started
    settled = total.happened + total.did_not_happen
    rate = settled / seconds if seconds else 0
    reapers.say(
        f"[reconcile] {settled:,} settled ({total.happened:,} happened, {total.did_not_happen:,} did not) "
        f"in {seconds:.1f} s = {rate:,.0f}/s; ratio to bare lookups {rate / bare:.3f}; "
        f"{counter.statements / max(settled, 1):.1f} SQL statements per reconciliation"
    )
    left = ReconciliationCase.objects.exclude(status="RESOLVED").count()
    if left or total.to_people:
        reapers.say(f"WARNING: {left} cases left unresolved, {total.to_people} handed to people")
    provider.stop()


if __name__ == "__main__":
    main()
