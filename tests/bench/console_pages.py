"""Benchmark: console pages at scale (server time and queries per page).

    python tests/bench/console_pages.py [--runs N] [--events-per-run E] [--cases C] [--reseed]
    make bench-console                       # 1M runs, 20M events, 100k open UNKNOWN in fl_scale
    make bench-console DATABASE_URL_SCALE=postgres://postgres@127.0.0.1:5432/fl_scale_small \
        BENCH_ARGS="--runs 10000 --events-per-run 20 --cases 1000 --big-run-events 20000"

A benchmark, not a test (pytest never collects it). Two steps:

1. seed (skipped when the database already holds a data set of exactly these sizes): in its
   own database (``fl_scale`` by default; created when missing and migrated every time) the
   tenants, workers and users are made through the services, everything else by COPY: N runs
   (default 1,000,000) each with its lease and lease grant, E events per run on average
   (default 20, so 20,000,000 events, including a few runs of --big-run-events events each),
   --ops-per-run operations per run, C open reconciliation cases (default 100,000: one UNKNOWN
   operation each; the run counters agree with the operations), resolved cases, and approval
   requests (pending, expired, used). Hashes have the real form ``sha256:<64 hex>`` but the
   chains are not valid: the pages never check them. All COPYs, with the tables' indexes,
   unique and foreign keys dropped first and recreated (so validated) after, run in one
   transaction, so an interrupted seed leaves nothing behind; VACUUM ANALYZE follows. The
   sizes are written into the database's comment; --reseed drops and recreates the database.

2. measure: through Django's test client, in this process, logged in (a user with the admin
   role on two of the three tenants, then a superuser), each page is requested --warmups
   times, then --requests times timed (wall clock around ``Client.get``: URL resolution,
   middleware, view, queries, template; not the network), then once more inside
   ``CaptureQueriesContext`` for its SQL. Pages: dashboard (full and its htmx partial), runs
   list (unfiltered, next page, each filter and search kind), run detail (a typical run and a
   run with --big-run-events events), reconciliation queue and approval queue (with their
   next pages). Prints median and p95 per page, the SQL time and the number of queries, the
   slowest statements, and EXPLAIN (ANALYZE, BUFFERS) of every statement over --explain-ms.

The test client never closes the database connection between requests, so every request
runs on one warm connection (as with persistent connections, DB_CONN_MAX_AGE > 0).

--try-sql FILE measures a change that is not made: the statements of FILE (candidate
indexes, ``SET LOCAL jit = off``, ...) run in a transaction around the whole measurement,
which is rolled back at the end, so the database is left as it was.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import html
import json
import math
import os
import re
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urljoin

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.fenced_transitions import BenchError, Server  # noqa: E402 - after the sys.path line above

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fl_scale"
MARKER = "fenceline console bench data set "  # the database comment: this + JSON of the sizes
SHAPE_VERSION = 3  # bump when the generated data changes shape (the sizes then differ: --reseed)
DAYS = 90  # runs are spread over this many days, the newest a minute before the seed
COPY_BYTES = 8 << 20  # one COPY write every ~8 MB of text
PROGRESS_EVERY_S = 1.0

# Tenants: slug and share of the runs. Run i's tenant is TENANT_OF[a hash of i], so that the
# runs picked by i % k (UNKNOWN, broken, ...) are spread over the tenants too.
TENANTS = ("scale-acme", "scale-globex", "scale-initech")
TENANT_OF = (0, 0, 0, 0, 0, 1, 1, 1, 2, 2)  # 50 % / 30 % / 20 %
USER_TENANTS = (0, 1)  # the benchmark user is admin on acme and globex: 80 % of the data
WORKERS_PER_TENANT = 10
BENCH_USER = "bench-console"
BENCH_SUPERUSER = "bench-console-root"
BIG_RUN_OPS = 150  # operations of each big run (the detail page shows the first 100)
BIG_RUN_STALE = 20  # stale-write refusals spread over each big run
TOOLS = ("stripe", "github", "slack", "s3", "sendgrid", "jira", "postgres", "openai")
RARE_TOOL = "pagerduty"  # slot 0 of one run in 1,000: a search that matches almost nothing
BROKEN_REASONS = ("prev_hash_mismatch", "gap", "mutated")

SEEDED_TABLES = (
    "ledger_run",
    "ledger_runlease",
    "ledger_leasegrant",
    "ledger_operation",
    "ledger_event",
    "approvals_reconciliationcase",
    "approvals_approvalrequest",
)

COLUMNS = {
    "ledger_run": (
        "schema_version",
        "id",
        "tenant_id",
        "parent_id",
        "external_id",
        "status",
        "created_at",
        "completed_at",
        "last_seq",
        "last_hash",
        "stale_rejections",
        "n_planned",
        "n_pending_approval",
        "n_authorized",
        "n_denied",
        "n_dispatched",
        "n_confirmed",
        "n_failed",
        "n_unknown",
        "n_reconciled",
        "verified_at",
        "verified_head_seq",
        "verified_checkpoint_seq",
        "trusted_seq",
        "trusted_hash",
        "broken_first_seq",
        "broken_last_seq",
        "broken_reason",
        "broken_detail",
        "authorization_mismatches",
        "authorization_detail",
        "may_be_in_flight",
    ),
    "ledger_runlease": (
        "schema_version",
        "run_id",
        "owner_id",
        "worker_id",
        "fencing_token",
        "acquired_at",
        "expires_at",
        "last_renewed_at",
        "end_reason",
    ),
    "ledger_leasegrant": (
        "id",
        "schema_version",
        "run_id",
        "fencing_token",
        "owner_id",
        "worker_id",
        "acquired_at",
        "previous_owner_id",
        "ended_at",
        "end_reason",
        "state",
        "tenant_id",
    ),
    "ledger_operation": (
        "schema_version",
        "id",
        "tenant_id",
        "run_id",
        "idempotency_key",
        "tool",
        "action",
        "resource",
        "effect_class",
        "args_digest",
        "provider",
        "estimated_cost_cents",
        "phase",
        "attempt",
        "created_at",
        "updated_at",
        "dispatched_at",
        "fencing_token",
        "dispatch_owner_id",
        "policy_version_at_dispatch",
        "provider_request_id",
        "error_code",
        "decision_policy_version",
        "decision_code",
        "reconciliation",
    ),
    "ledger_event": (
        "id",
        "schema_version",
        "run_id",
        "seq",
        "event_id",
        "type",
        "actor",
        "occurred_at",
        "fields",
        "prev_hash",
        "hash",
    ),
    "approvals_reconciliationcase": (
        "schema_version",
        "id",
        "tenant_id",
        "run_id",
        "operation_id",
        "attempt",
        "status",
        "reason",
        "opened_at",
        "unverified_evidence",
        "claimed_by",
        "claimed_at",
        "resolution",
        "resolution_reason",
        "resolved_by",
        "resolved_at",
    ),
    "approvals_approvalrequest": (
        "schema_version",
        "id",
        "tenant_id",
        "run_id",
        "kind",
        "operation_id",
        "capability_id",
        "attempt",
        "args_digest",
        "fencing_token",
        "status",
        "requested_at",
        "expires_at",
        "decided_by",
        "decided_at",
        "reason",
        "used_at",
    ),
}

N = r"\N"  # NULL in COPY text


def say(line: str = "") -> None:
    print(line, flush=True)


# --- time as COPY text ------------------------------------------------------------------

_HOURS: dict[int, str] = {}


def ts(us: int) -> str:
    """Microseconds since the epoch as a timestamptz literal (a cache per hour: fast)."""
    hour, rest = divmod(us, 3_600_000_000)
    prefix = _HOURS.get(hour)
    if prefix is None:
        prefix = _HOURS[hour] = datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%d %H:")
    minute, rest = divmod(rest, 60_000_000)
    second, micro = divmod(rest, 1_000_000)
    return f"{prefix}{minute:02d}:{second:02d}.{micro:06d}+00"


def epoch_us(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


# --- the data set's shape: every attribute of run i is a function of i ---------------------


class Plan:
    """The data set, deterministic per run index i (0 = oldest). Run ids are random and kept
    in a list; an operation's, case's or approval's id is its run's id with the last four
    hex digits replaced, so it needs no memory."""

    def __init__(
        self,
        *,
        runs: int,
        events_per_run: int,
        cases: int,
        ops_per_run: int,
        big_runs: int,
        big_run_events: int,
        seeded_at: datetime,
    ) -> None:
        if runs < 100:
            raise BenchError("--runs must be at least 100")
        if ops_per_run < 2:
            raise BenchError("--ops-per-run must be at least 2 (slot 1 carries the approval requests)")
        if not 1 <= cases <= runs // 2:
            raise BenchError("--cases must be between 1 and half of --runs (one UNKNOWN operation per such run)")
        self.runs, self.events_per_run, self.cases, self.ops_per_run = runs, events_per_run, cases, ops_per_run
        self.total_events = runs * events_per_run
        self.n_active = max(1, runs // 50)  # the newest 2 % are ACTIVE and hold their lease
        self.stride = runs // cases  # run i has an UNKNOWN operation iff i % stride == 0 and i // stride < cases
        self.seeded_at = seeded_at
        self.end_us = epoch_us(seeded_at) - 60_000_000
        self.step_us = DAYS * 86_400_000_000 // runs
        self.big = self._big_indexes(big_runs)
        big_events = min(big_run_events, self.total_events // (2 * max(1, len(self.big))))
        self.big_events = big_events if self.big else 0
        rest = self.total_events - len(self.big) * self.big_events
        self.base_events, self.extra_events = divmod(rest, runs - len(self.big))
        if self.base_events < 8:
            raise BenchError("--events-per-run is too small: every run needs at least 8 events")
        self.big_sorted = sorted(self.big)

    def _big_indexes(self, count: int) -> set[int]:
        """Completed runs of the user's first tenant, not UNKNOWN-carrying, a few apart."""
        found: list[int] = []
        i = self.runs - self.n_active - 1
        while len(found) < count and i > 0:
            if self.tenant(i) == USER_TENANTS[0] and i % self.stride != 0 and not self.is_special(i):
                found.append(i)
                i -= max(1, self.runs // 1000)
            else:
                i -= 1
        return set(found)

    # attributes of run i

    def tenant(self, i: int) -> int:
        return TENANT_OF[((i * 2654435761) & 0xFFFFFFFF) * 10 >> 32]  # Knuth's multiplicative hash

    def active(self, i: int) -> bool:
        return i >= self.runs - self.n_active

    def created_us(self, i: int) -> int:
        return self.end_us - (self.runs - 1 - i) * self.step_us

    def events(self, i: int) -> int:
        if i in self.big:
            return self.big_events
        k = i - bisect.bisect_left(self.big_sorted, i)  # rank among the ordinary runs
        return self.base_events + (1 if k < self.extra_events else 0)

    def ops(self, i: int) -> int:
        return BIG_RUN_OPS if i in self.big else self.ops_per_run

    def unknown(self, i: int) -> bool:
        return i % self.stride == 0 and i // self.stride < self.cases

    def reconciled(self, i: int) -> bool:
        return self.stride > 1 and i % self.stride == 1 and (i // self.stride) % 5 == 0 and i not in self.big

    def is_special(self, i: int) -> bool:
        return i % 1000 == 17 or i % 2000 == 23 or i % 97 == 11 or i % 1000 == 500

    def stale(self, i: int) -> int:
        if i in self.big:
            return BIG_RUN_STALE
        return 1 + i % 3 if i % 97 == 11 else 0

    def broken(self, i: int) -> str:
        return BROKEN_REASONS[(i // 1000) % 3] if i % 1000 == 17 and not self.active(i) else ""

    def mismatched(self, i: int) -> bool:
        return i % 2000 == 23

    def approval(self, i: int) -> str:
        """What slot 1's approval request is: pending, expired, used, or none."""
        if i in self.big:
            return ""
        if self.active(i):
            return {0: "pending", 3: "expired"}.get(i % 7, "")
        return "used" if i % 50 == 1 else ""

    def phases(self, i: int) -> list[str]:
        n = self.ops(i)
        out = ["CONFIRMED"] * n
        if i in self.big:
            return out
        if self.unknown(i):
            out[0] = "UNKNOWN"
        elif self.reconciled(i):
            out[0] = "RECONCILED"
        elif self.active(i) and i % 2 == 0:
            out[0] = "DISPATCHED"
        elif i % 53 == 5:
            out[0] = "FAILED"
        kind = self.approval(i)
        if kind == "pending":
            out[1] = "PENDING_APPROVAL"
        elif kind == "expired":
            out[1] = "DENIED"
        elif self.active(i) and i % 7 == 5:
            out[1] = "AUTHORIZED"
        return out

    def tool(self, i: int, slot: int) -> str:
        if slot == 0 and i % 1000 == 500:
            return RARE_TOOL
        return TOOLS[(i + slot) % len(TOOLS)]

    def external_id(self, i: int) -> str | None:
        return None if i % 10 == 4 else f"job-{i:07d}"

    def worker(self, i: int) -> int:
        return (i // 10) % WORKERS_PER_TENANT

    @staticmethod
    def worker_name(w: int) -> str:
        return f"worker-{w + 1:02d}"

    def owner(self, i: int) -> str:
        return f"host-{i % 61:02d}:{1000 + i % 997}"

    def tail(self, i: int) -> str:
        """The run's last event hash (the events and the run row agree on it)."""
        return "sha256:" + hashlib.sha256(b"fl-scale-%d" % i).hexdigest()

    @staticmethod
    def child_id(run_id: str, tag: str) -> str:
        return run_id[:-4] + tag

    def shape(self) -> dict:
        return {
            "version": SHAPE_VERSION,
            "runs": self.runs,
            "events": self.total_events,
            "cases_open": self.cases,
            "ops_per_run": self.ops_per_run,
            "big_runs": len(self.big),
            "big_run_events": self.big_events,
        }


# --- seeding ------------------------------------------------------------------------------


class Copier:
    """COPY text into one table on one psycopg connection, in ~8 MB writes, with progress.
    NOT NULL columns the generator does not know (added by a later migration, no database
    default) get a type-appropriate zero value; columns it names that are gone stop the run."""

    def __init__(self, conn, table: str, total: int, label: str) -> None:
        self.conn, self.table, self.total, self.label = conn, table, total, label
        columns = COLUMNS[table]
        rows = conn.execute(
            "SELECT column_name, data_type, is_nullable, column_default, is_identity "
            "FROM information_schema.columns WHERE table_schema = 'public' AND table_name = %s",
            [table],
        ).fetchall()
        live = {r[0]: r for r in rows}
        gone = [c for c in columns if c not in live]
        if gone:
            raise BenchError(f"{table} has no column {', '.join(gone)}: update COLUMNS in {Path(__file__).name}")
        fills = []
        for name, data_type, nullable, default, identity in rows:
            if name in columns or nullable == "YES" or default is not None or identity == "YES":
                continue
            zero = {"jsonb": "{}", "boolean": "f", "timestamp with time zone": ts(epoch_us(datetime.now(UTC)))}.get(
                data_type, "0" if data_type in {"integer", "bigint", "smallint", "numeric"} else ""
            )
            fills.append((name, zero))
            say(f"  note: {table}.{name} (NOT NULL, new to this script) filled with {zero!r}")
        self.columns = list(columns) + [name for name, _ in fills]
        self.sep = "".join("\t" + zero for _, zero in fills) + "\n"
        self.lines: list[str] = []
        self.size = 0
        self.count = 0
        self.started = self.last_print = time.monotonic()
        self.copy_cm = None
        self.copy = None

    def __enter__(self):
        cursor = self.conn.cursor()
        self.copy_cm = cursor.copy(f"COPY {self.table} ({', '.join(self.columns)}) FROM STDIN WITH (FREEZE)")
        self.copy = self.copy_cm.__enter__()
        return self

    def add(self, line: str) -> None:
        self.lines.append(line)
        self.size += len(line)
        if self.size >= COPY_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.lines:
            self.copy.write(self.sep.join(self.lines) + self.sep)
            self.count += len(self.lines)
            self.lines, self.size = [], 0
        now = time.monotonic()
        if now - self.last_print >= PROGRESS_EVERY_S:
            self.last_print = now
            rate = self.count / max(now - self.started, 1e-9)
            print(f"\r  {self.label}: {self.count:,}/{self.total:,} ({rate:,.0f}/s)", end="", flush=True)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.flush()
        result = self.copy_cm.__exit__(exc_type, exc, tb)
        if exc_type is None:
            elapsed = time.monotonic() - self.started
            print(
                f"\r  {self.label}: {self.count:,} rows in {elapsed:.1f}s ({self.count / max(elapsed, 1e-9):,.0f}/s)   "
            )
        return result


def saved_schema(conn) -> tuple[list, list, list]:
    """Foreign keys touching the seeded tables, their primary/unique constraints and their
    other indexes, as (table, name, definition), to drop before COPY and recreate after."""
    tables = list(SEEDED_TABLES)
    fks = conn.execute(
        "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
        "WHERE c.contype = 'f' AND (c.conrelid::regclass::text = ANY(%s) OR c.confrelid::regclass::text = ANY(%s)) "
        "ORDER BY 1, 2",
        [tables, tables],
    ).fetchall()
    keys = conn.execute(
        "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
        "WHERE c.contype IN ('p', 'u') AND c.conrelid::regclass::text = ANY(%s) ORDER BY c.contype, 1, 2",
        [tables],
    ).fetchall()
    indexes = conn.execute(
        "SELECT i.tablename, i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = 'public' "
        "AND i.tablename = ANY(%s) AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = "
        "(quote_ident(i.schemaname) || '.' || quote_ident(i.indexname))::regclass AND c.contype IN ('p', 'u', 'x')) "
        "ORDER BY 1, 2",
        [tables],
    ).fetchall()
    return fks, keys, indexes


def timed(conn, label: str, sql: str) -> None:
    t0 = time.monotonic()
    print(f"  {label} ...", end="", flush=True)
    conn.execute(sql)
    print(f" {time.monotonic() - t0:.1f}s", flush=True)


def copy_runs(conn, plan: Plan, run_ids: list[str], tenant_ids: list[int]) -> None:
    g = "sha256:" + "0" * 64
    with Copier(conn, "ledger_run", plan.runs, "runs") as out:
        for i, run_id in enumerate(run_ids):
            phases = plan.phases(i)
            count = dict.fromkeys(
                (
                    "PLANNED",
                    "PENDING_APPROVAL",
                    "AUTHORIZED",
                    "DENIED",
                    "DISPATCHED",
                    "CONFIRMED",
                    "FAILED",
                    "UNKNOWN",
                    "RECONCILED",
                ),
                0,
            )
            for p in phases:
                count[p] += 1
            created = plan.created_us(i)
            last_seq = plan.events(i)
            tail = plan.tail(i)
            active = plan.active(i)
            completed = N if active else ts(min(created + (last_seq + 5) * 1_000_000, plan.end_us))
            checked = plan.end_us  # the verifier's last pass: never after the seed

            broken = plan.broken(i)
            if broken:
                first = last_seq // 2
                last = first + 2 if broken == "gap" else first
                verified = (
                    ts(min(created + (last_seq + 65) * 1_000_000, checked)),
                    str(last_seq),
                    N,
                    str(first - 1),
                    g,
                )
                broken_cols = (str(first), str(last), broken, f"{broken} at seq {first}")
            elif active or i % 20 == 9:  # unsealed: the verifier has not caught up
                sealed = max(1, last_seq - 3)
                verified = (
                    ts(min(created + (sealed + 65) * 1_000_000, checked)),
                    str(sealed),
                    str(sealed),
                    str(sealed),
                    g,
                )
                broken_cols = (N, N, "", "")
            else:
                verified = (
                    ts(min(created + (last_seq + 65) * 1_000_000, checked)),
                    str(last_seq),
                    str(last_seq),
                    str(last_seq),
                    tail,
                )
                broken_cols = (N, N, "", "")
            mismatch = ("1", "dispatched under a revoked credential lease") if plan.mismatched(i) else ("0", "")
            external = plan.external_id(i) or N
            out.add(
                "\t".join(
                    (
                        "1",
                        run_id,
                        str(tenant_ids[plan.tenant(i)]),
                        N,
                        external,
                        "ACTIVE" if active else "COMPLETED",
                        ts(created),
                        completed,
                        str(last_seq),
                        tail,
                        str(plan.stale(i)),
                        str(count["PLANNED"]),
                        str(count["PENDING_APPROVAL"]),
                        str(count["AUTHORIZED"]),
                        str(count["DENIED"]),
                        str(count["DISPATCHED"]),
                        str(count["CONFIRMED"]),
                        str(count["FAILED"]),
                        str(count["UNKNOWN"]),
                        str(count["RECONCILED"]),
                        *verified,
                        *broken_cols,
                        *mismatch,
                        "t" if active else "f",  # a finished run here has nothing in flight
                    )
                )
            )


def copy_leases(conn, plan: Plan, run_ids: list[str], worker_ids: list[list[int]], tenant_ids: list[int]) -> None:
    now_us = epoch_us(plan.seeded_at)
    with Copier(conn, "ledger_runlease", plan.runs, "run leases") as out:
        for i, run_id in enumerate(run_ids):
            created = plan.created_us(i)
            if plan.active(i):
                # Held; one in a hundred overdue (the reaper has not run), the rest far ahead.
                expires = now_us - 300_000_000 if i % 100 == 1 else now_us + 365 * 86_400_000_000
                worker = str(worker_ids[plan.tenant(i)][plan.worker(i)])
                out.add(
                    "\t".join(
                        (
                            "1",
                            run_id,
                            plan.owner(i),
                            worker,
                            "1",
                            ts(created + 1_000_000),
                            ts(expires),
                            ts(created + 2_000_000),
                            N,
                        )
                    )
                )
            else:
                ended = ts(created + (plan.events(i) + 4) * 1_000_000)
                out.add("\t".join(("1", run_id, N, N, "1", ts(created + 1_000_000), ended, N, "RELEASED")))
    with Copier(conn, "ledger_leasegrant", plan.runs, "lease grants") as out:
        for i, run_id in enumerate(run_ids):
            created = plan.created_us(i)
            worker = str(worker_ids[plan.tenant(i)][plan.worker(i)])
            if plan.active(i):
                ended, reason, state = N, N, "RUNNING"
            else:
                ended, reason, state = ts(created + (plan.events(i) + 4) * 1_000_000), "RELEASED", "RELEASED"
            out.add(
                "\t".join(
                    (
                        str(i + 1),
                        "1",
                        run_id,
                        "1",
                        plan.owner(i),
                        worker,
                        ts(created + 1_000_000),
                        N,
                        ended,
                        reason,
                        state,
                        str(tenant_ids[plan.tenant(i)]),
                    )
                )
            )


def copy_operations(conn, plan: Plan, run_ids: list[str], tenant_ids: list[int]) -> None:
    total = sum(plan.ops(i) for i in plan.big) + (plan.runs - len(plan.big)) * plan.ops_per_run
    effect = ("IDEMPOTENT", "REPLAYABLE", "NON_RETRYABLE", "IDEMPOTENT", "PURE")
    action = {
        "stripe": "charge",
        "github": "create_issue",
        "slack": "post_message",
        "s3": "put_object",
        "sendgrid": "send_email",
        "jira": "create_ticket",
        "postgres": "execute",
        "openai": "complete",
        RARE_TOOL: "trigger_incident",
    }
    dispatched_phases = {"DISPATCHED", "CONFIRMED", "FAILED", "UNKNOWN", "RECONCILED"}
    with Copier(conn, "ledger_operation", total, "operations") as out:
        for i, run_id in enumerate(run_ids):
            tenant = str(tenant_ids[plan.tenant(i)])
            created = plan.created_us(i)
            owner = plan.owner(i)
            for slot, phase in enumerate(plan.phases(i)):
                tool = plan.tool(i, slot)
                at = created + (3 + 4 * slot) * 1_000_000
                digest = hashlib.md5(b"%d/%d" % (i, slot), usedforsecurity=False).hexdigest()
                dispatched = phase in dispatched_phases
                if phase == "CONFIRMED":
                    provider_id, error = f"req_{digest[:20]}", ""
                elif phase == "FAILED":
                    provider_id, error = "", "PROVIDER_5XX"
                elif phase == "RECONCILED":
                    provider_id, error = (f"req_{digest[:20]}" if i % 2 else ""), ""
                else:
                    provider_id, error = "", ""
                decision = {"PENDING_APPROVAL": "APPROVAL_REQUIRED", "DENIED": "DENY_EXPIRED"}.get(phase, "ALLOW")
                out.add(
                    "\t".join(
                        (
                            "1",
                            plan.child_id(run_id, f"{slot:04x}"),
                            tenant,
                            run_id,
                            f"run{i}-op{slot}",
                            tool,
                            action[tool],
                            f"{tool}://acct-{i % 113}/{action[tool]}/{i}-{slot}",
                            effect[(i + slot) % 5],
                            "sha256:" + digest * 2,
                            "" if tool not in {"openai", "stripe"} else tool,
                            N,
                            phase,
                            "1",
                            ts(at),
                            ts(at + 2_000_000),
                            ts(at + 1_000_000) if dispatched else N,
                            "1" if dispatched else N,
                            owner if dispatched else N,
                            "1" if dispatched else N,
                            provider_id,
                            error,
                            "1",
                            decision,
                            ("HAPPENED" if i % 2 else "DID_NOT_HAPPEN") if phase == "RECONCILED" else "",
                        )
                    )
                )


def copy_cases(conn, plan: Plan, run_ids: list[str], tenant_ids: list[int]) -> int:
    resolved = sum(1 for i in range(plan.runs) if plan.reconciled(i))
    with Copier(conn, "approvals_reconciliationcase", plan.cases + resolved, "reconciliation cases") as out:
        for i, run_id in enumerate(run_ids):
            unknown, reconciled = plan.unknown(i), plan.reconciled(i)
            if not (unknown or reconciled):
                continue
            opened = plan.created_us(i) + 9_000_000
            h = (i // plan.stride) % 20
            reason = "WORKER_REPORTED_UNKNOWN" if h in (5, 11) else "LEASE_LOST"
            evidence = "[]"
            if h == 7:
                evidence = json.dumps(
                    [
                        {
                            "provider_request_id": f"req_late_{i}",
                            "fencing_token": 1,
                            "owner_id": plan.owner(i),
                            "reported_at": ts(opened + 60_000_000),
                            "reported_outcome": "CONFIRMED",
                        }
                    ]
                )
            if unknown:
                status = "OPEN" if h < 16 else ("CLAIMED" if h < 19 else "ESCALATED")
                claimed = ("ops-alice", ts(opened + 600_000_000)) if status != "OPEN" else ("", N)
                resolution = ("", "", "", N)
            else:
                status = "RESOLVED"
                claimed = ("ops-bob", ts(opened + 600_000_000))
                resolution = (
                    "HAPPENED" if i % 2 else "DID_NOT_HAPPEN",
                    "checked the provider's dashboard",
                    "ops-bob",
                    ts(opened + 900_000_000),
                )
            out.add(
                "\t".join(
                    (
                        "1",
                        plan.child_id(run_id, "c000"),
                        str(tenant_ids[plan.tenant(i)]),
                        run_id,
                        plan.child_id(run_id, "0000"),
                        "1",
                        status,
                        reason,
                        ts(opened),
                        evidence,
                        *claimed,
                        resolution[0],
                        resolution[1],
                        resolution[2],
                        resolution[3],
                    )
                )
            )
    return resolved


def copy_approvals(conn, plan: Plan, run_ids: list[str], tenant_ids: list[int]) -> dict[str, int]:
    now_us = epoch_us(plan.seeded_at)
    counts = {"pending": 0, "expired": 0, "used": 0}
    total = sum(1 for i in range(plan.runs) if plan.approval(i))
    with Copier(conn, "approvals_approvalrequest", total, "approval requests") as out:
        for i, run_id in enumerate(run_ids):
            kind = plan.approval(i)
            if not kind:
                continue
            counts[kind] += 1
            created = plan.created_us(i)
            if kind == "pending":
                # Asked ten minutes before the seed, open for 30 days: still PENDING on a re-run.
                asked, expires = now_us - 600_000_000 + i, now_us + 30 * 86_400_000_000 + i
                decided = ("PENDING", "", N, "", N)
            elif kind == "expired":
                asked = created + 7_000_000
                expires = asked + 3_600_000_000
                decided = ("EXPIRED", "", N, "", N)
            else:
                asked = created + 7_000_000
                expires = asked + 3_600_000_000
                decided = ("USED", "ops-carol", ts(asked + 120_000_000), "expected charge", ts(asked + 180_000_000))
            digest = hashlib.md5(b"%d/1" % i, usedforsecurity=False).hexdigest()
            out.add(
                "\t".join(
                    (
                        "1",
                        plan.child_id(run_id, "a001"),
                        str(tenant_ids[plan.tenant(i)]),
                        run_id,
                        "OPERATION",
                        plan.child_id(run_id, "0001"),
                        N,
                        "1",
                        "sha256:" + digest * 2,
                        "1",
                        decided[0],
                        ts(asked),
                        ts(expires),
                        decided[1],
                        decided[2],
                        decided[3],
                        decided[4],
                    )
                )
            )
    return counts


def copy_events(conn, plan: Plan, run_ids: list[str], worker_names: list[str]) -> None:
    """The events, ~3 µs of Python each: random 64-hex hashes chained by prev_hash within a
    run (the last one is the run's last_hash), random event ids, realistic types and fields."""
    genesis = "sha256:" + "0" * 64
    cycle = ("OPERATION_PLANNED", "OPERATION_AUTHORIZED", "OPERATION_DISPATCHED", "OPERATION_CONFIRMED", "NOTE")
    moves = {
        "OPERATION_PLANNED": ("null", "PLANNED"),
        "OPERATION_AUTHORIZED": ('"PLANNED"', "AUTHORIZED"),
        "OPERATION_DISPATCHED": ('"AUTHORIZED"', "DISPATCHED"),
        "OPERATION_CONFIRMED": ('"DISPATCHED"', "CONFIRMED"),
    }
    stale_fields = (
        '{"attempted": "operation_dispatch", "presented_token": 1, "current_token": 2, '
        '"reason": "token superseded by a newer lease"}'
    )
    event_id = 0
    with Copier(conn, "ledger_event", plan.total_events, "events") as out:
        for i, run_id in enumerate(run_ids):
            n = plan.events(i)
            created = plan.created_us(i)
            active = plan.active(i)
            stale = plan.stale(i)
            if i in plan.big:
                stale_seqs = {(j + 1) * n // (stale + 1) for j in range(stale)}
            else:
                stale_seqs = {n - 2 - j for j in range(stale)} if n > stale + 6 else set()
            actor = f"worker:{worker_names[plan.worker(i)]}/{plan.owner(i)}"
            n_ops = plan.ops(i)
            rnd = os.urandom(48 * n).hex()
            prev = genesis
            tail = plan.tail(i)
            prefix = run_id[:-4]
            for seq in range(1, n + 1):
                o = 96 * (seq - 1)
                digest = tail if seq == n else "sha256:" + rnd[o : o + 64]
                e = rnd[o + 64 : o + 96]
                if seq in stale_seqs:
                    kind, fields = "STALE_TOKEN_REJECTED", stale_fields
                elif seq == 1:
                    kind, fields = "RUN_CREATED", '{"schema_version": 1, "external_id": null}'
                elif seq == 2:
                    kind, fields = "LEASE_ACQUIRED", '{"fencing_token": 1, "ttl_s": 300}'
                elif not active and seq == n - 1:
                    kind, fields = "LEASE_RELEASED", '{"fencing_token": 1}'
                elif not active and seq == n:
                    kind, fields = "RUN_COMPLETED", "{}"
                else:
                    k = seq - 3
                    kind = cycle[k % 5]
                    if kind == "NOTE":
                        fields = f'{{"note": "step {seq} checked", "step": {seq}}}'
                    else:
                        src, dst = moves[kind]
                        fields = (
                            f'{{"operation_id": "{prefix}{(k // 5) % n_ops:04x}", "from": {src}, "to": "{dst}", '
                            f'"attempt": 1}}'
                        )
                out.add(
                    f"{event_id + seq}\t1\t{run_id}\t{seq}\t{e[:8]}-{e[8:12]}-4{e[13:16]}-a{e[17:20]}-{e[20:32]}\t"
                    f"{kind}\t{actor}\t{ts(created + seq * 1_000_000)}\t{fields}\t{prev}\t{digest}"
                )
                prev = digest
            event_id += n


def seed(server: Server, database: str, plan: Plan) -> dict:
    """Tenants, workers and users through the services; the rest by COPY in one transaction."""
    from ledger.models import Worker
    from ledger.services.fleet.workers import worker_create
    from ledger.services.tenancy.tenants import tenant_ensure

    started = time.monotonic()
    tenants = [tenant_ensure(slug=slug)[0] for slug in TENANTS]
    worker_ids, worker_names = [], [Plan.worker_name(w) for w in range(WORKERS_PER_TENANT)]
    for tenant in tenants:
        existing = {w.name: w.pk for w in Worker.objects.filter(tenant=tenant)}
        ids = []
        for name in worker_names:
            ids.append(existing[name] if name in existing else worker_create(tenant=tenant, name=name)[0].pk)
        worker_ids.append(ids)
    tenant_ids = [t.pk for t in tenants]
    say(f"  run ids: {plan.runs:,} random uuids ...")
    run_ids = [
        f"{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"
        for h in (os.urandom(16).hex() for _ in range(plan.runs))
    ]

    conn = server.connect(database)
    conn.autocommit = False
    steps: dict[str, float] = {}
    try:
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET work_mem = '256MB'")
        conn.execute("SET synchronous_commit = off")
        fks, keys, indexes = saved_schema(conn)
        say(
            f"  dropping {len(fks)} foreign keys, {len(keys)} primary/unique keys and {len(indexes)} indexes "
            "(recreated after the COPY, in the same transaction)"
        )
        for table, name, _ in fks:
            conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for table, name, _ in keys:
            conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for _, name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        # TRUNCATE in this transaction lets COPY write frozen, all-visible rows (COPY FREEZE).
        conn.execute(f"TRUNCATE {', '.join(SEEDED_TABLES)}")

        t0 = time.monotonic()
        copy_runs(conn, plan, run_ids, tenant_ids)
        copy_leases(conn, plan, run_ids, worker_ids, tenant_ids)
        copy_operations(conn, plan, run_ids, tenant_ids)
        resolved = copy_cases(conn, plan, run_ids, tenant_ids)
        approvals = copy_approvals(conn, plan, run_ids, tenant_ids)
        steps["copy runs, leases, operations, cases, approvals"] = time.monotonic() - t0
        t0 = time.monotonic()
        copy_events(conn, plan, run_ids, worker_names)
        steps["copy events"] = time.monotonic() - t0

        t0 = time.monotonic()
        say("  recreating keys and indexes:")
        for table, name, definition in keys + [(t, n, d) for t, n, d in indexes]:
            if definition.startswith("CREATE"):
                timed(conn, f"{name}", definition)
            else:
                timed(conn, f"{name}", f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        steps["indexes and unique keys"] = time.monotonic() - t0
        t0 = time.monotonic()
        say("  recreating (and so validating) foreign keys:")
        for table, name, definition in fks:
            timed(conn, f"{name}", f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        steps["foreign keys"] = time.monotonic() - t0
        for table in ("ledger_event", "ledger_leasegrant"):
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        t0 = time.monotonic()
        say("  commit ...")
        conn.commit()
        steps["commit"] = time.monotonic() - t0
    except BaseException:
        conn.rollback()
        conn.close()
        raise
    conn.autocommit = True
    t0 = time.monotonic()
    for table in SEEDED_TABLES:
        timed(conn, f"VACUUM ANALYZE {table}", f"VACUUM (ANALYZE) {table}")
    steps["vacuum analyze"] = time.monotonic() - t0
    conn.close()
    seconds = time.monotonic() - started
    info = {
        **plan.shape(),
        "seeded_at": plan.seeded_at.isoformat(),
        "seed_seconds": round(seconds, 1),
        "steps": {k: round(v, 1) for k, v in steps.items()},
        "cases_resolved": resolved,
        "approvals": approvals,
    }
    return info


def read_marker(server: Server, database: str) -> dict | None:
    with server.connect(database) as conn:
        comment = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = current_database()"
        ).fetchone()[0]
    if not comment or not comment.startswith(MARKER):
        return None
    try:
        return json.loads(comment[len(MARKER) :])
    except ValueError:
        return None


def write_marker(server: Server, database: str, info: dict) -> None:
    from psycopg import sql

    with server.connect(database) as conn:
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(database), sql.Literal(MARKER + json.dumps(info))
            )
        )


def database_holds_data(server: Server, database: str) -> bool:
    with server.connect(database) as conn:
        return conn.execute("SELECT EXISTS (SELECT 1 FROM ledger_run)").fetchone()[0]


def migrations_applied() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        if "django_migrations" not in connection.introspection.table_names(cursor):
            return 0
        cursor.execute("SELECT count(*) FROM django_migrations")
        return cursor.fetchone()[0]


def prepare_database(server: Server, database: str, reseed: bool) -> None:
    from psycopg import sql

    if not database.startswith("fl_scale"):
        raise BenchError(f"refusing to use database {database!r}: this benchmark drops and seeds only fl_scale*")
    with server.connect_admin() as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if exists and reseed:
            say(f"dropping database {database} (--reseed) ...")
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))
            exists = None
        if not exists:
            say(f"creating database {database} ...")
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


# --- measuring ----------------------------------------------------------------------------


class Meter:
    """Counts the statements of a request and the time spent in them (execute_wrapper)."""

    def __init__(self) -> None:
        self.queries, self.seconds = 0, 0.0

    def reset(self) -> None:
        self.queries, self.seconds = 0, 0.0

    def __call__(self, execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - t0
            self.queries += 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


NEXT_LINK = re.compile(r'<a href="([^"]+)"[^>]*>\s*Next page')
PREV_LINK = re.compile(r'<a href="([^"]+)" rel="prev"')


def measure(args, info: dict, database: str) -> int:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from ledger.models import Tenant
    from ledger.services.operating.totals import run_totals_store
    from ledger.services.tenancy.roles import role_grant

    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=TENANTS)}
    for k in USER_TENANTS:
        role_grant(username=BENCH_USER, tenant=tenants[TENANTS[k]], role="admin")
    User = get_user_model()
    root, _ = User.objects.get_or_create(username=BENCH_SUPERUSER, defaults={"is_superuser": True, "is_staff": True})
    if not root.is_superuser:
        root.is_superuser = root.is_staff = True
        root.save(update_fields=["is_superuser", "is_staff"])
    users = {"admin on 2 tenants": User.objects.get(username=BENCH_USER), "superuser": root}
    if args.users != "both":
        users = {k: v for k, v in users.items() if k.startswith("super") == (args.users == "superuser")}

    probes = info["probes"]
    htmx = {"HX-Request": "true"}
    pages = [
        ("dashboard", "/", {}),
        ("dashboard, htmx partial", "/", htmx),
        ("runs", "/runs/", {}),
        ("runs, next page", "next:runs", {}),
        ("runs ?status=ACTIVE", "/runs/?status=ACTIVE", {}),
        ("runs ?integrity=BROKEN", "/runs/?integrity=BROKEN", {}),
        ("runs ?certainty=UNCERTAIN", "/runs/?certainty=UNCERTAIN", {}),
        ("runs ?completeness=INCOMPLETE", "/runs/?completeness=INCOMPLETE", {}),
        ("runs ?authorization=MISMATCH", "/runs/?authorization=MISMATCH", {}),
        ("runs ?q=<external id>", f"/runs/?q={probes['external_id']}", {}),
        ("runs ?q=<run id>", f"/runs/?q={probes['search_run']}", {}),
        ("runs ?q=<worker name>", f"/runs/?q={probes['worker']}", {}),
        ("runs ?q=<tool, 1 run in 1,000>", f"/runs/?q={RARE_TOOL}", {}),
        ("runs ?q=<tool, 1 run in 4>", f"/runs/?q={TOOLS[0]}", {}),
        ("run detail (typical, UNKNOWN op)", f"/runs/{probes['typical_run']}/", {}),
        (f"run detail ({info['big_run_events']:,} events)", f"/runs/{probes['big_run']}/", {}),
        ("run timeline, htmx, deep page", f"/runs/{probes['big_run']}/?after={info['big_run_events'] // 2}", htmx),
        # The triage filters (issue 17): each a list a person pages through.
        ("runs ?tenant=<one of two>", f"/runs/?tenant={TENANTS[1]}", {}),
        ("runs ?worker=<name prefix>", f"/runs/?worker={probes['worker']}", {}),
        ("runs ?tool=<tool, 1 run in 4>", f"/runs/?tool={TOOLS[0]}", {}),
        ("runs ?tool=<tool, 1 run in 1,000>", f"/runs/?tool={RARE_TOOL}", {}),
        ("runs ?class=NON_RETRYABLE", "/runs/?class=NON_RETRYABLE", {}),
        ("runs ?phase=UNKNOWN", "/runs/?phase=UNKNOWN", {}),
        ("runs ?stuck=yes", "/runs/?stuck=yes", {}),
        ("runs ?stuck=yes&sort=oldest", "/runs/?stuck=yes&sort=oldest", {}),
        ("runs ?sort=oldest", "/runs/?sort=oldest", {}),
        ("run page, live poll (htmx)", f"/runs/{probes['typical_run']}/?live=1", htmx),
        ("dashboard, trends partial (htmx)", "/", {**htmx, "HX-Target": "trends"}),
        ("cases (reconciliation queue)", "/cases/", {}),
        ("cases ?status=unclaimed", "/cases/?status=unclaimed", {}),
        ("cases ?status=mine", "/cases/?status=mine", {}),
        ("cases ?status=all (resolved too)", "/cases/?status=all", {}),
        ("approvals ?status=all", "/approvals/?status=all", {}),
        ("approvals ?status=decided&sort=newest", "/approvals/?status=decided&sort=newest", {}),
        ("workers", "/workers/", {}),
        ("credentials (leases)", "/credentials/", {}),
        # A tenant's page: its policy, roles, runbooks, flow limits and the breaker levers' report.
        ("tenant page", f"/tenants/{TENANTS[1]}/", {}),
        ("tenants", "/tenants/", {}),
        ("settings (my routes)", "/settings/", {}),
        ("cases, next page", "next:cases", {}),
        ("approvals (approval queue)", "/approvals/", {}),
        ("approvals, next page", "next:approvals", {}),
        # The activity feed (ledger/activity.py): every tenant's events and admin records.
        ("activity (feed)", "/activity/", {}),
        ("activity, next page", "next:activity", {}),
        ("activity, live poll (htmx)", "/activity/", {**htmx, "HX-Target": "activity-feed"}),
        ("activity ?tenant=<one of two>", f"/activity/?tenant={TENANTS[1]}", {}),
        ("activity ?within=1h", "/activity/?within=1h", {}),
        ("activity ?who=<a person>", f"/activity/?who={BENCH_USER}", {}),
        ("activity ?kind=job", "/activity/?kind=job", {}),
        ("activity ?kind=worker", "/activity/?kind=worker", {}),
        ("activity ?type=STALE_TOKEN_REJECTED", "/activity/?type=STALE_TOKEN_REJECTED", {}),
        ("activity ?type=<in no event>", "/activity/?type=CASE_RESOLVED", {}),
        ("runs, next page then back", "prev:runs", {}),
        # Not a page: what a Prometheus scrape costs at this size (every DB-derived metric; the
        # run totals as the count-run-totals job keeps them, counted just before).
        ("/metrics (a scrape)", "/metrics", {}),
    ]
    if args.pages:
        wanted = [p.strip() for p in args.pages.split(",")]
        pages = [p for p in pages if any(w in p[0] for w in wanted)]

    meter = Meter()
    results = []
    slow: dict[str, dict] = {}  # sql -> the slowest capture of it
    say()
    say(f"measuring: {args.warmups} warm-up + {args.requests} timed requests per page, then 1 with the SQL captured")
    with connection.execute_wrapper(meter):
        for who, user in users.items():
            client = Client(raise_request_exception=False)  # a failing page is reported, not fatal
            client.force_login(user)
            next_links: dict[str, str] = {}
            prev_links: dict[str, str] = {}
            for name, path, headers in pages:
                if path.startswith(("next:", "prev:")):
                    links = next_links if path.startswith("next:") else prev_links
                    path = links.get(path[5:], "")
                    if not path:
                        results.append({"page": name, "user": who, "error": f"no {name.split()[-1]} page"})
                        continue
                if path == "/metrics":  # as the count-run-totals job keeps them (every 15 s)
                    t0 = time.perf_counter()
                    tenants = run_totals_store()
                    say(
                        f"  (the count-run-totals job: {tenants} tenants in {(time.perf_counter() - t0) * 1000:.0f} ms)"
                    )
                times, sql_times, counts, size, status = [], [], set(), 0, None
                for n in range(args.warmups + args.requests):
                    meter.reset()
                    t0 = time.perf_counter()
                    response = client.get(path, headers=headers)
                    elapsed = time.perf_counter() - t0
                    status, size = response.status_code, len(response.content)
                    if n >= args.warmups:
                        times.append(elapsed * 1000)
                        sql_times.append(meter.seconds * 1000)
                        counts.add(meter.queries)
                with CaptureQueriesContext(connection) as captured:
                    response = client.get(path, headers=headers)
                if status != 200:
                    results.append({"page": name, "user": who, "error": f"HTTP {status}"})
                    continue
                match = NEXT_LINK.search(response.content.decode())
                area = path.split("?")[0].strip("/").split("/")[0] or "home"
                if match and area not in next_links:
                    next_links[area] = urljoin(path, html.unescape(match.group(1)))
                back = PREV_LINK.search(response.content.decode())
                if back and area not in prev_links:
                    prev_links[area] = urljoin(path, html.unescape(back.group(1)))
                for q in captured.captured_queries:
                    ms = float(q["time"]) * 1000
                    if ms >= args.slow_ms and ms > slow.get(q["sql"], {}).get("ms", -1):
                        slow[q["sql"]] = {"ms": ms, "page": name, "user": who}
                results.append(
                    {
                        "page": name,
                        "user": who,
                        "path": path,
                        "median": statistics.median(times),
                        "p95": percentile(times, 0.95),
                        "sql": statistics.median(sql_times),
                        "queries": "/".join(str(c) for c in sorted(counts)),
                        "kb": size / 1024,
                    }
                )
                r = results[-1]
                say(
                    f"  {who:<20} {name:<36} {r['median']:8.1f} ms  (p95 {r['p95']:.1f}, SQL {r['sql']:.1f}, "
                    f"{r['queries']} queries)"
                )

    report(args, info, results, slow, database)
    return 0


def measure_what_if(args, info: dict, database: str) -> int:
    """The measurement inside one transaction that first runs the statements of --try-sql
    (candidate indexes, settings) and is rolled back at the end: figures for a change that
    is never kept. The views' own transactions become savepoints of this one."""
    from django.db import connection, transaction

    text = Path(args.try_sql).read_text()
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    statements = [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
    with transaction.atomic():
        say(f"what-if: {len(statements)} statements from {args.try_sql}, rolled back after the measurement:")
        with connection.cursor() as cursor:
            for statement in statements:
                t0 = time.monotonic()
                cursor.execute(statement)
                say(f"  {time.monotonic() - t0:5.1f}s  {' '.join(statement.split())[:150]}")
        try:
            return measure(args, info, database)
        finally:
            transaction.set_rollback(True)


def report(args, info: dict, results: list[dict], slow: dict[str, dict], database: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        version = cursor.fetchone()[0].split(" on ")[0]
        cursor.execute(
            "SELECT current_setting('shared_buffers'), current_setting('work_mem'), "
            "current_setting('random_page_cost'), current_setting('jit')"
        )
        shared, work_mem, rpc, jit = cursor.fetchone()
        cursor.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        size = cursor.fetchone()[0]
    say()
    say(
        f"machine: {os.cpu_count()} cores; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load {os.getloadavg()[0]:.2f}; "
        f"{version} (shared_buffers {shared}, work_mem {work_mem}, random_page_cost {rpc}, jit {jit})"
    )
    say(
        f"data set ({database}, {size}): {info['runs']:,} runs, {info['events']:,} events, "
        f"{info['cases_open']:,} open UNKNOWN cases (+{info['cases_resolved']:,} resolved), "
        f"{info['ops_per_run']} operations per run, approvals {info['approvals']}; "
        f"{info['big_runs']} runs of {info['big_run_events']:,} events; seeded {info['seeded_at'][:16]} "
        f"in {info['seed_seconds']:,.0f}s"
    )
    say(f"times: wall clock of Client.get, {args.requests} requests after {args.warmups} warm-ups")
    if args.try_sql:
        say(f"what-if: with the statements of {args.try_sql} (rolled back afterwards)")
    say()
    width = max(len(r["page"]) for r in results) + 2
    head = f"{'page':<{width}} {'user':<20} {'median ms':>10} {'p95 ms':>8} {'SQL ms':>8} {'queries':>8} {'KB':>6}"
    say(head)
    say("-" * len(head))
    for r in results:
        if "error" in r:
            say(f"{r['page']:<{width}} {r['user']:<20} {r['error']}")
            continue
        flag = "  *" if r["median"] > args.target_ms else ""
        say(
            f"{r['page']:<{width}} {r['user']:<20} {r['median']:>10.1f} {r['p95']:>8.1f} {r['sql']:>8.1f} "
            f"{r['queries']:>8} {r['kb']:>6.0f}{flag}"
        )
    over = [r for r in results if "error" not in r and r["median"] > args.target_ms]
    say()
    say(f"{len(over)} of {len(results)} page measurements over {args.target_ms:.0f} ms (marked *)")
    if not slow:
        return
    say()
    say(f"statements over {args.slow_ms:.0f} ms (slowest first, each once):")
    for sql, hit in sorted(slow.items(), key=lambda kv: -kv[1]["ms"]):
        shown = condensed(sql)
        shown = shown if len(shown) <= args.sql_chars else shown[: args.sql_chars] + " ..."
        say(f"\n[{hit['ms']:.1f} ms] {hit['page']} ({hit['user']})\n{shown}")
        if hit["ms"] >= args.explain_ms:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plan = "\n".join("    " + row[0] for row in cursor.fetchall())
            say(plan)


def condensed(sql: str) -> str:
    """The statement with its select list shortened to a column count (for reading only)."""
    match = re.match(r"SELECT (.*?) FROM ", sql, re.DOTALL)
    if match and match.group(1).count('"') > 8:
        return f"SELECT <{match.group(1).count(',') + 1} columns> FROM " + sql[match.end() :]
    return sql


def find_probes(info: dict) -> dict:
    """Runs and values the pages are measured on, found once after seeding."""
    from django.db import connection

    from ledger.models import Tenant

    user_tenants = list(Tenant.objects.filter(slug__in=[TENANTS[k] for k in USER_TENANTS]).values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM ledger_run WHERE tenant_id = ANY(%s) ORDER BY last_seq DESC LIMIT 1", [user_tenants]
        )
        big = cursor.fetchone()[0]
        cursor.execute(
            "SELECT run_id FROM approvals_reconciliationcase WHERE tenant_id = ANY(%s) AND status = 'OPEN' "
            "ORDER BY opened_at DESC LIMIT 1",
            [user_tenants],
        )
        typical = cursor.fetchone()[0]
        middle = info["runs"] // 3
        cursor.execute(
            "SELECT id, external_id FROM ledger_run WHERE tenant_id = ANY(%s) AND external_id IS NOT NULL "
            "AND external_id >= %s ORDER BY external_id LIMIT 1",
            [user_tenants, f"job-{middle:07d}"],
        )
        search_run, external = cursor.fetchone()
    return {
        "big_run": str(big),
        "typical_run": str(typical),
        "search_run": str(search_run),
        "external_id": external,
        "worker": Plan.worker_name(2),
    }


def django_setup(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DJANGO_DEBUG"] = "0"  # timing with DEBUG off; CaptureQueriesContext works regardless
    hosts = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
    if "testserver" not in hosts.split(","):
        os.environ["DJANGO_ALLOWED_HOSTS"] = hosts + ",testserver"  # the test client's host
    import django

    django.setup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--events-per-run", type=int, default=20, help="average; total events = runs x this")
    parser.add_argument("--cases", type=int, default=100_000, help="open reconciliation cases (UNKNOWN operations)")
    parser.add_argument("--ops-per-run", type=int, default=2)
    parser.add_argument("--big-runs", type=int, default=3, help="runs with --big-run-events events each")
    parser.add_argument("--big-run-events", type=int, default=100_000)
    parser.add_argument("--reseed", action="store_true", help="drop the database and seed again")
    parser.add_argument("--seed-only", action="store_true")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per page")
    parser.add_argument("--warmups", type=int, default=3)
    parser.add_argument("--users", choices=("both", "user", "superuser"), default="both")
    parser.add_argument("--pages", default="", help="only pages whose name contains one of these (comma-separated)")
    parser.add_argument("--target-ms", type=float, default=100.0)
    parser.add_argument("--slow-ms", type=float, default=10.0, help="print statements slower than this")
    parser.add_argument("--explain-ms", type=float, default=50.0, help="EXPLAIN ANALYZE statements slower than this")
    parser.add_argument("--sql-chars", type=int, default=3000)
    parser.add_argument(
        "--try-sql",
        metavar="FILE",
        help="run these statements (e.g. CREATE INDEX, SET LOCAL jit = off) "
        "in a transaction around the measurement, then roll it back: what-if figures, nothing kept",
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)

    try:
        server = Server(args.database_url)
        database = server.url_database
        prepare_database(server, database, args.reseed)
        django_setup(server.url_for(database))
        from django.core.management import call_command

        say(f"migrating {database} ...")
        applied = migrations_applied()
        call_command("migrate", verbosity=0)
        if migrations_applied() != applied and database_holds_data(server, database):
            # New indexes (e.g. on expressions) need statistics, and autovacuum may be off.
            with server.connect(database) as conn:
                for table in SEEDED_TABLES:
                    timed(conn, f"ANALYZE {table} (new migrations)", f"ANALYZE {table}")
        plan = Plan(
            runs=args.runs,
            events_per_run=args.events_per_run,
            cases=args.cases,
            ops_per_run=args.ops_per_run,
            big_runs=args.big_runs,
            big_run_events=args.big_run_events,
            seeded_at=datetime.now(UTC),
        )
        info = read_marker(server, database)
        if info and {k: info.get(k) for k in plan.shape()} == plan.shape():
            say(
                f"{database} already holds this data set (seeded {info['seeded_at'][:16]} in "
                f"{info['seed_seconds']:,.0f}s); --reseed to seed it again"
            )
        elif info or database_holds_data(server, database):
            held = f"{info['runs']:,} runs, {info['events']:,} events" if info else "an unknown data set"
            if info and info.get("version") != SHAPE_VERSION:
                held += f" of generator version {info.get('version')} (this script writes version {SHAPE_VERSION})"
            raise BenchError(f"{database} holds {held}, not the one asked for: pass --reseed to replace it")
        else:
            say(
                f"seeding {database}: {plan.runs:,} runs, {plan.total_events:,} events, {plan.cases:,} open UNKNOWN "
                f"cases, {plan.ops_per_run} operations per run, {len(plan.big)} runs of {plan.big_events:,} events"
            )
            info = seed(server, database, plan)
            info["probes"] = find_probes(info)
            write_marker(server, database, info)
            say(
                f"seeded in {info['seed_seconds']:,.1f}s: "
                + ", ".join(f"{k} {v:,.0f}s" for k, v in info["steps"].items())
            )
        if args.seed_only:
            return 0
        if args.try_sql:
            return measure_what_if(args, info, database)
        return measure(args, info, database)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
