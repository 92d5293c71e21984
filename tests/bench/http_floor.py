"""Benchmark: the HTTP stack's own cost per request, the floor under every API call.

    python tests/bench/http_floor.py [--clients 4] [--workers 4] [--seconds 8] [--rounds 2]
                                     [--servers gthread,production,sync,uvicorn]

A benchmark, not a test: pytest never collects this file. gunicorn serves the project as the
HTTP phase of ``make bench`` runs it (``tests/bench/http_phase.py``: gthread workers, kept
connections), and N client processes send ``GET /healthz`` over kept-alive connections with
urllib3, as the worker client does. That view reads no database and authenticates nobody, so
what the gunicorn processes spend per request is what every request pays before any service
runs: gunicorn's parsing and threads, Django's handler and signals, the middleware, the
request's log line and latency sample, the JSON response. The HTTP phase of ``make bench``
measures the same after its timed loop ("its floor"); this runs it alone, for longer.

Prints, per round: requests/s and gunicorn CPU per request (utime + stime of the master and
its workers, from /proc). With several ``--servers`` (the options of
``tests/bench/http_phase.SERVERS``), each server is started in turn and the rounds alternate
between them (round 1 of each, then round 2 of each), so a machine that gets busier halfway
weighs on all of them alike; the last lines compare each to the first.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import DEFAULT_URL  # noqa: E402 - the path above first
from tests.bench.http_phase import FLOOR_PATH, SERVERS, Gunicorn, floor_round  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="client processes (4)")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes (4)")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each round (8)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds against the same server (2)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_URL,
        help="the database the server is configured with; /healthz never reads it (default $DATABASE_URL)",
    )
    parser.add_argument(
        "--servers",
        default="gthread",
        help=f"comma-separated server options, measured alternately: {', '.join(SERVERS)} (default gthread)",
    )
    args = parser.parse_args()
    if min(args.clients, args.workers, args.rounds) < 1 or args.seconds <= 0:
        parser.error("--clients, --workers, --rounds and --seconds must be positive")
    names = [name.strip() for name in args.servers.split(",") if name.strip()]
    unknown = [name for name in names if name not in SERVERS]
    if unknown or not names:
        parser.error(f"--servers: unknown {', '.join(unknown) or '(none given)'}; the options: {', '.join(SERVERS)}")
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for index in range(args.rounds):
        for name in names:
            server = Gunicorn(args.database_url, args.workers, name)
            try:
                server.wait_ready()
                floor_round(server, args.clients, 1.0)  # warm: every worker has imported and answered
                rate, cpu_us = floor_round(server, args.clients, args.seconds)
            finally:
                server.stop()
            measured[name].append((rate, cpu_us))
            print(
                f"round {index + 1}, {name:10} ({args.workers} workers, {args.clients} keep-alive clients): "
                f"GET {FLOOR_PATH} {rate:,.0f}/s, server CPU {cpu_us:,.0f} us per request",
                flush=True,
            )
    first = names[0]
    base_cpu = min(cpu for _, cpu in measured[first])
    for name in names:
        best_rate = max(rate for rate, _ in measured[name])
        best_cpu = min(cpu for _, cpu in measured[name])
        print(
            f"{name:10} best of {args.rounds}: {best_rate:,.0f}/s, {best_cpu:,.0f} us per request"
            + (f" ({best_cpu / base_cpu:.2f} x {first}'s CPU)" if name != first else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
