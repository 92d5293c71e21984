"""Benchmark: the HTTP stack's own cost per request, the floor under every API call.

    python tests/bench/http_floor.py [--clients 4] [--workers 4] [--seconds 8] [--rounds 2]

A benchmark, not a test: pytest never collects this file. gunicorn serves the project as the
HTTP phase of ``make bench`` runs it (``tests/bench/http_phase.py``: gthread workers, kept
connections), and N client processes send ``GET /healthz`` over kept-alive connections with
urllib3, as the worker client does. That view reads no database and authenticates nobody, so
what the gunicorn processes spend per request is what every request pays before any service
runs: gunicorn's parsing and threads, Django's handler and signals, the middleware, the
request's log line and latency sample, the JSON response. The HTTP phase of ``make bench``
measures the same after its timed loop ("its floor"); this runs it alone, for longer.

Prints, per round: requests/s and gunicorn CPU per request (utime + stime of the master and
its workers, from /proc).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import DEFAULT_URL  # noqa: E402 - the path above first
from tests.bench.http_phase import FLOOR_PATH, Gunicorn, floor_round  # noqa: E402


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
    args = parser.parse_args()
    if min(args.clients, args.workers, args.rounds) < 1 or args.seconds <= 0:
        parser.error("--clients, --workers, --rounds and --seconds must be positive")
    server = Gunicorn(args.database_url, args.workers)
    try:
        server.wait_ready()
        print(f"gunicorn with {args.workers} gthread workers at {server.url}; {args.clients} keep-alive clients")
        floor_round(server, args.clients, 1.0)  # warm: every worker has imported and answered
        for index in range(args.rounds):
            rate, cpu_us = floor_round(server, args.clients, args.seconds)
            print(f"round {index + 1}: GET {FLOOR_PATH} {rate:,.0f}/s, gunicorn CPU {cpu_us:,.0f} us per request")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
