"""The peer of ``make bench``: DBOS Transact's durable steps per second on the same PostgreSQL.

    .bench/dbos/bin/python tests/bench/dbos_peer.py --workers N --seconds S --database-url URL

A benchmark, not a test. Run by tests/bench/fenced_transitions.py (``--peer dbos``) in a
bench-only environment (``.bench/dbos``, the pinned DBOS release of tests/bench/peer-requirements.txt,
never the product's dependencies). N processes, each with DBOS launched on the system
database ``fenceline_bench_dbos`` (dropped and recreated per run; one launch in the parent
creates its schema before the workers start), loop for S seconds running a workflow of
``--steps`` no-op steps (``@DBOS.step``) and count the steps completed. DBOS records each step
in PostgreSQL before the workflow goes on: at least once, no fence before the effect, no
UNKNOWN state, no chain. Prints one JSON line: workers, seconds, steps, steps_per_s and the
workers' CPU per step (user + system, from getrusage).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from urllib.parse import urlsplit, urlunsplit

PEER_DB = "fenceline_bench_dbos"


def _database_url(url: str, name: str) -> str:
    parts = urlsplit(url)
    scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
    return urlunsplit((scheme, parts.netloc, "/" + name, "", ""))


def _recreate(url: str) -> None:
    import psycopg

    with psycopg.connect(_database_url(url, "postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {PEER_DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {PEER_DB}")


def _launch(url: str):
    from dbos import DBOS

    @DBOS.step()
    def noop(index: int) -> int:
        return index

    @DBOS.workflow()
    def four_steps(count: int) -> int:
        total = 0
        for index in range(count):
            total += noop(index)
        return total

    DBOS(config={"name": "fenceline-peer", "system_database_url": _database_url(url, PEER_DB), "log_level": "WARNING"})
    DBOS.launch()
    return DBOS, four_steps


def _worker(url: str, steps: int, seconds: float, ready, go, results) -> None:
    dbos, workflow = _launch(url)
    workflow(steps)  # warm: connections open, statements planned
    ready.put(True)
    go.wait()
    before = resource.getrusage(resource.RUSAGE_SELF)
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline:
        workflow(steps)
        done += steps
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    results.put({"steps": done, "cpu_s": cpu, "finished": time.monotonic()})
    dbos.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", "-n", type=int, default=4)
    parser.add_argument("--seconds", "-s", type=float, default=15)
    parser.add_argument("--steps", type=int, default=4, help="no-op steps per workflow (default 4)")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args(argv)
    _recreate(args.database_url)
    dbos, workflow = _launch(args.database_url)  # creates the system database's schema once
    workflow(args.steps)
    dbos.destroy()
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(args.database_url, args.steps, args.seconds, ready, go, results))
        for _ in range(args.workers)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    started = time.monotonic()
    go.set()
    collected = [results.get(timeout=args.seconds + 120) for _ in procs]
    for proc in procs:
        proc.join(60)
    elapsed = max(item["finished"] for item in collected) - started
    steps = sum(item["steps"] for item in collected)
    cpu = sum(item["cpu_s"] for item in collected)
    print(
        json.dumps(
            {
                "peer": "dbos",
                "workers": args.workers,
                "seconds": round(elapsed, 3),
                "steps": steps,
                "steps_per_s": steps / elapsed if elapsed else 0.0,
                "cpu_ms_per_step": 1000 * cpu / steps if steps else None,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
