"""The failed worker-token authentications of a client address, counted in a fixed window by
one statement (``ledger/services/fleet/token_failures.py``)."""

from datetime import datetime
from functools import cache

from django.db import connection

from ledger.models import TokenFailureWindow
from ledger.sql.connection import execute
from ledger.sql.rows import column
from ledger.versioning import CURRENT_SCHEMA_VERSION


@cache
def _count_failure_sql() -> str:
    qn = connection.ops.quote_name
    table = qn(TokenFailureWindow._meta.db_table)
    address, started, failures, version = (
        qn(column(TokenFailureWindow, name)) for name in ("address", "window_started_at", "failures", "schema_version")
    )
    # %s: address, now, version; then the window's start bound twice (is the row's window current?).
    return (
        f"INSERT INTO {table} AS w ({address}, {started}, {failures}, {version}) VALUES (%s, %s, 1, %s) "
        f"ON CONFLICT ({address}) DO UPDATE SET "
        f"{failures} = CASE WHEN w.{started} > %s THEN w.{failures} + 1 ELSE 1 END, "
        f"{started} = CASE WHEN w.{started} > %s THEN w.{started} ELSE EXCLUDED.{started} END "
        f"RETURNING {failures}, {started}"
    )


def count_failure(*, address: str, now: datetime, window_starts_after: datetime) -> tuple[int, datetime]:
    """One more failure from ``address``: its window (started after ``window_starts_after``)
    counts on, or a new one starts at ``now``. The failures in the window and its start."""
    params = [address, now, CURRENT_SCHEMA_VERSION, window_starts_after, window_starts_after]
    failures, started = execute(_count_failure_sql(), params).fetchone()
    return int(failures), started
