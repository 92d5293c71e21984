"""Benchmark: what PostgreSQL does per fenced transition, against pgbench's tpcb-like
transaction, on a server of the benchmark's own (the figures that do not depend on the load).

    python tests/bench/server_side.py [--runs 30] [--pgbench-transactions 10000]
    make bench-server BENCH_ARGS="--runs 60"

A benchmark, not a test: pytest never collects this file.

By default it starts a throwaway PostgreSQL (the ``initdb`` and ``postgres`` of ``pg_config
--bindir``, or ``--pg-bin``) in a temporary directory on a free port, with
``pg_stat_statements`` loaded and autovacuum off, so that nothing else writes WAL or runs
statements beside what is measured; it stops and removes it at the end. As root, the server
runs as the ``postgres`` system user. ``--database-url`` uses a running server instead
(``pg_stat_statements`` in its ``shared_preload_libraries``; its WAL then counts every other
database's writes too, and its own bench databases are recreated).

Two phases, one process each, one after the other:

1. **fenced (plain)**: the cycle of ``make bench``'s plain mode (``run_create ->
   lease_acquire -> 20 x (intend -> authorize -> dispatch -> outcome) -> lease_release``)
   for ``--runs`` runs, after the same warm-up and ANALYZE;
2. **pgbench**: ``pgbench -b tpcb-like -c 1 -t T`` after ``pgbench -i -s 10``.

For each: statements per transaction (``pg_stat_statements`` calls in that database, with
BEGIN / COMMIT counted apart), WAL bytes per transaction (``pg_current_wal_lsn()`` before and
after; with ``pg_waldump --stats`` when the WAL directory is readable: full-page images apart,
and by resource manager), PostgreSQL backend CPU per transaction (``/proc`` of the backend)
and the statements' execution time (``pg_stat_statements``). Statement counts and WAL bytes
do not depend on the load; CPU and time do (read them as a ratio from one run). Then the
fenced phase's statements, heaviest WAL first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import (  # noqa: E402 - after the path set-up
    BENCH_DB,
    PGBENCH_DB,
    BackendCpu,
    BenchError,
    Server,
    django_setup,
    fenced_cycles,
    prepare_fenced_db,
    prepare_pgbench,
    say,
)

UTILITY = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|END|START)\b", re.IGNORECASE)
SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_utility": "on",
    "pg_stat_statements.max": "5000",
    "autovacuum": "off",  # as on the benchmarks' servers (docs/performance.md)
    "checkpoint_timeout": "1h",  # no checkpoint inside a phase: full-page images only as any run has them
    "max_wal_size": "8GB",
    "synchronous_commit": "on",
    "shared_buffers": "128MB",
    "listen_addresses": "'127.0.0.1'",
    "jit": "off",
}


# --- the server -----------------------------------------------------------------------


def _pg_bindir(given: str | None) -> Path:
    if given:
        return Path(given)
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (found / "initdb").exists():
            return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    raise BenchError("no initdb found: install PostgreSQL's server package, or pass --pg-bin DIR or --database-url")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def own_server(bindir: Path) -> Iterator[tuple[str, Path]]:
    """A throwaway PostgreSQL: (its URL, its data directory), stopped and removed after."""
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    top = Path(tempfile.mkdtemp(prefix="fenceline-server-side-"))
    data = top / "data"
    if as_root:
        shutil.chown(top, "postgres")
    port = _free_port()
    try:
        proc = subprocess.run(
            [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise BenchError(f"initdb failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1]}")
        with open(data / "postgresql.conf", "a") as conf:
            for name, value in {**SERVER_SETTINGS, "port": str(port), "unix_socket_directories": f"'{top}'"}.items():
                conf.write(f"{name} = {value}\n")
        proc = subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(top / "log"), "-w", "start"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise BenchError(f"the server did not start: see {top / 'log'}")
        say(f"[server] own PostgreSQL at 127.0.0.1:{port} ({data}), pg_stat_statements loaded, autovacuum off")
        yield f"postgres://postgres@127.0.0.1:{port}/postgres", data
    finally:
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True
        )
        shutil.rmtree(top, ignore_errors=True)


# --- one phase's figures --------------------------------------------------------------


@dataclass
class Statement:
    query: str
    calls: int
    rows: int
    exec_ms: float
    wal_bytes: int
    wal_fpi: int
    toplevel: bool  # sent by the client; else run inside another (a foreign key's check)


@dataclass
class Phase:
    name: str
    transactions: int = 0
    wal_lsn: int = 0  # bytes between the two LSNs
    backend_cpu_s: float | None = None
    statements: list[Statement] = field(default_factory=list)
    waldump: dict[str, tuple[int, int]] = field(default_factory=dict)  # resource manager -> (record, FPI bytes)

    def work(self) -> list[Statement]:
        return [s for s in self.statements if not _nested(s) and not UTILITY.match(s.query)]

    def nested(self) -> list[Statement]:
        return [s for s in self.statements if _nested(s)]

    def utility(self) -> list[Statement]:
        return [s for s in self.statements if UTILITY.match(s.query)]


# A foreign key's check, as PostgreSQL runs it (deferred ones at COMMIT, counted as top level).
FOREIGN_KEY_CHECK = re.compile(r'^SELECT \$?\d+ FROM ONLY "[^"]+"\."[^"]+" x WHERE .* FOR KEY SHARE OF x$', re.DOTALL)


def _nested(statement: Statement) -> bool:
    """Run by PostgreSQL inside the client's statements: a trigger's, a foreign key's check."""
    return not statement.toplevel or bool(FOREIGN_KEY_CHECK.match(statement.query.strip()))


class Meter:
    """Resets and reads pg_stat_statements and the WAL position around a phase, from the
    ``postgres`` database (its own statements are not counted: another database)."""

    def __init__(self, server: Server, database: str, data_dir: Path | None, bindir: Path | None) -> None:
        self.server, self.database, self.data_dir, self.bindir = server, database, data_dir, bindir
        self.admin = server.connect("postgres")
        self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        try:
            self.admin.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except Exception as exc:
            raise BenchError(
                "pg_stat_statements is not loaded on this server (shared_preload_libraries): leave "
                "--database-url out to use a server of the benchmark's own"
            ) from exc
        self.start_lsn = ""
        self.backends = BackendCpu(database)

    def start(self) -> None:
        # No CHECKPOINT here: on the server of its own (checkpoint_timeout 1h) neither phase
        # then writes full-page images, as in make bench's pgbench phase; a checkpoint would
        # make pgbench's random updates write one per page they touch (~8 KB per transaction).
        self.admin.execute("SELECT pg_stat_statements_reset()")
        self.start_lsn = str(self.admin.execute("SELECT pg_current_wal_lsn()").fetchone()[0])
        self.backends.start()

    def stop(self, phase: Phase) -> None:
        end_lsn = str(self.admin.execute("SELECT pg_switch_wal()").fetchone()[0])  # its segment complete for waldump
        phase.backend_cpu_s = self.backends.stop()
        phase.wal_lsn = int(
            self.admin.execute("SELECT %s::pg_lsn - %s::pg_lsn", [end_lsn, self.start_lsn]).fetchone()[0]
        )
        rows = self.admin.execute(
            "SELECT s.query, s.calls, s.rows, s.total_exec_time + s.total_plan_time, s.wal_bytes, s.wal_fpi,"
            " s.toplevel"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
            [self.database],
        ).fetchall()
        phase.statements = [
            Statement(q, int(c), int(r), float(t), int(w), int(f), bool(top)) for q, c, r, t, w, f, top in rows
        ]
        phase.waldump = self._waldump(end_lsn)

    def _waldump(self, end_lsn: str) -> dict[str, tuple[int, int]]:
        if self.data_dir is None or self.bindir is None:
            return {}
        proc = subprocess.run(
            [str(self.bindir / "pg_waldump"), "--stats", "-p", str(self.data_dir / "pg_wal"),
             "-s", self.start_lsn, "-e", end_lsn],
            capture_output=True, text=True,
        )  # fmt: skip
        stats = {}
        for line in proc.stdout.splitlines():
            # Type  N (%)  Record size (%)  FPI size (%)  Combined size (%)
            match = re.match(r"^(\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)", line)
            if match and match.group(1) not in ("Type", "----", "Total"):
                stats[match.group(1)] = (int(match.group(3)), int(match.group(4)))
        return stats

    def close(self) -> None:
        self.admin.close()


# --- the phases -----------------------------------------------------------------------


def fenced_phase(server: Server, runs: int, ops_per_lease: int, data_dir, bindir) -> Phase:
    pks = prepare_fenced_db(server, BENCH_DB, 1, analyze=True, ops_per_lease=ops_per_lease)
    django_setup(server.url_for(BENCH_DB))
    from django.db import connection

    from ledger.models import Worker

    worker = Worker.objects.select_related("tenant").get(pk=pks[0])
    connection.ensure_connection()
    phase = Phase("fenced (plain)")
    done = {"runs": 0}

    def call(kind, fn, **kwargs):
        value = fn(**kwargs)
        phase.transactions += 1
        if kind == "release":
            done["runs"] += 1
        return value

    meter = Meter(server, BENCH_DB, data_dir, bindir)
    try:
        meter.start()
        say(f"[fenced] {runs} runs x {ops_per_lease} operations, one process")
        fenced_cycles(worker, 0, f"server-side-{time.time_ns()}", ops_per_lease, call, lambda: done["runs"] >= runs)
        connection.close()
        meter.stop(phase)
    finally:
        meter.close()
    return phase


def pgbench_phase(server: Server, pgbench: str, transactions: int, scale: int, data_dir, bindir) -> Phase:
    prepare_pgbench(server, PGBENCH_DB, pgbench, scale)
    phase = Phase("pgbench tpcb-like")
    meter = Meter(server, PGBENCH_DB, data_dir, bindir)
    try:
        meter.start()
        say(f"[pgbench] pgbench -b tpcb-like -c 1 -t {transactions}")
        proc = subprocess.run(
            [pgbench, "-b", "tpcb-like", "-c", "1", "-t", str(transactions), *server.pg_args(PGBENCH_DB)],
            env=server.pg_env(), capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise BenchError(f"pgbench failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1]}")
        processed = re.search(r"number of transactions actually processed: (\d+)", proc.stdout)
        phase.transactions = int(processed.group(1)) if processed else transactions
        time.sleep(0.3)  # the backend's exit, for its last CPU reading
        meter.stop(phase)
    finally:
        meter.close()
    return phase


# --- the report -----------------------------------------------------------------------


def per(value: float | None, n: int, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    if value is None or not n:
        return "n/a"
    return f"{value * scale / n:,.{digits}f}{unit}"


def report(fenced: Phase, pg: Phase, top: int) -> None:
    def figures(phase: Phase) -> dict[str, float | None]:
        n = phase.transactions
        fpi = sum(f for _, f in phase.waldump.values()) if phase.waldump else None
        return {
            "statements": sum(s.calls for s in phase.work()) / n,
            "utility": sum(s.calls for s in phase.utility()) / n,
            "nested": sum(s.calls for s in phase.nested()) / n,
            "wal": phase.wal_lsn / n,
            "wal_no_fpi": (phase.wal_lsn - fpi) / n if fpi is not None else None,
            "cpu_us": phase.backend_cpu_s * 1e6 / n if phase.backend_cpu_s is not None else None,
            "exec_us": sum(s.exec_ms for s in phase.statements) * 1e3 / n,
        }

    f, p = figures(fenced), figures(pg)

    def line(label: str, key: str, unit: str, digits: int) -> None:
        a, b = f[key], p[key]
        ratio = f"{a / b:.2f}" if a is not None and b else "n/a"
        fa = "n/a" if a is None else f"{a:,.{digits}f}{unit}"
        fb = "n/a" if b is None else f"{b:,.{digits}f}{unit}"
        say(f"{label:<44}{fa:>16}{fb:>18}{ratio:>9}")

    say()
    say(f"{'per transaction':<44}{'fenced (plain)':>16}{'pgbench tpcb':>18}{'ratio':>9}")
    say(f"{'transactions measured':<44}{fenced.transactions:>16,}{pg.transactions:>18,}")
    line("statements sent (pg_stat_statements)", "statements", "", 2)
    line("  and BEGIN / COMMIT", "utility", "", 2)
    line("  and run by PostgreSQL (foreign keys, triggers)", "nested", "", 2)
    line("WAL bytes (pg_current_wal_lsn)", "wal", " B", 0)
    line("  without full-page images (pg_waldump)", "wal_no_fpi", " B", 0)
    line("backend CPU (/proc; noisy under load)", "cpu_us", " us", 0)
    line("statement time (pg_stat_statements; noisy)", "exec_us", " us", 0)
    say()
    say("goals (issue 41): backend CPU <= 1.3 x pgbench's, WAL <= 2 x")
    if fenced.waldump:
        say()
        say("WAL by resource manager, bytes per transaction (record + full-page images):")
        for name in sorted(set(fenced.waldump) | set(pg.waldump), key=lambda k: -sum(fenced.waldump.get(k, (0, 0)))):
            fr, ff = fenced.waldump.get(name, (0, 0))
            gr, gf = pg.waldump.get(name, (0, 0))
            if fr + ff + gr + gf:
                say(
                    f"  {name:<16} fenced {fr / fenced.transactions:>7,.0f} + {ff / fenced.transactions:>6,.0f}"
                    f"   pgbench {gr / pg.transactions:>7,.0f} + {gf / pg.transactions:>6,.0f}"
                )
    say()
    say(f"fenced statements, heaviest WAL first (per transition: calls, WAL bytes, ms total; top {top}):")
    n = fenced.transactions
    for s in sorted(fenced.statements, key=lambda s: (-s.wal_bytes, -s.calls))[:top]:
        text = " ".join(s.query.split())
        say(f"  {s.calls / n:5.2f} {s.wal_bytes / n:7,.0f} B {s.exec_ms:8.1f} ms  {text[:150]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs of the fenced cycle measured (default 30)")
    parser.add_argument("--ops-per-lease", type=int, default=20, help="operations per run (default 20)")
    parser.add_argument(
        "--pgbench-transactions", type=int, default=10_000, help="pgbench -t, one client (default 10000)"
    )
    parser.add_argument("--scale", type=int, default=10, help="pgbench -i scale factor (default 10)")
    parser.add_argument("--top", type=int, default=12, help="statements listed (default 12)")
    parser.add_argument("--pg-bin", help="PostgreSQL's bin directory for the server of the benchmark's own")
    parser.add_argument(
        "--database-url",
        help="use this running server (pg_stat_statements preloaded) instead of one of the benchmark's own",
    )
    parser.add_argument("--pgbench", default=shutil.which("pgbench") or "/usr/bin/pgbench")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.ops_per_lease < 1 or args.pgbench_transactions < 1:
        parser.error("--runs, --ops-per-lease and --pgbench-transactions must be at least 1")
    try:
        pgbench = shutil.which(args.pgbench)
        if not pgbench:
            raise BenchError(f"pgbench not found ({args.pgbench!r}); install postgresql-client or pass --pgbench")
        with contextlib.ExitStack() as stack:
            if args.database_url:
                url, data_dir, bindir = args.database_url, None, None
            else:
                bindir = _pg_bindir(args.pg_bin)
                url, data_dir = stack.enter_context(own_server(bindir))
            server = Server(url)
            say(f"[setup] load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
            fenced = fenced_phase(server, args.runs, args.ops_per_lease, data_dir, bindir)
            pg = pgbench_phase(server, pgbench, args.pgbench_transactions, args.scale, data_dir, bindir)
            report(fenced, pg, args.top)
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
