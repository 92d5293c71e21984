"""Reads the ORM cannot say: the planner's estimate of a queryset's size, the check that the
database answers, and the primary's synchronous standbys."""

import json
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import IntegerField, QuerySet, Subquery

from ledger.sql.connection import execute


def estimated_count(qs: QuerySet[Any]) -> int:
    """The planner's estimate of how many rows ``qs`` holds (PostgreSQL's EXPLAIN: no row
    is read, so it costs the same at a million runs as at ten)."""
    try:
        sql, params = qs.order_by().values("pk").query.sql_with_params()
    except EmptyResultSet:  # Django knows it matches nothing (no visible tenant, no match)
        return 0
    with connection.cursor() as cursor:  # the ORM's own statement, with its own placeholders
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def ping() -> None:
    """One round trip: raises the database's error when it does not answer."""
    execute("SELECT 1", [])


class CappedCount(Subquery):
    """How many rows a correlated queryset has, counted up to its slice: ``(SELECT count(*)
    FROM (<the queryset, LIMITed>) AS capped)``. A count that walks an index and stops at the
    limit, so a page that shows "500 or more" costs the same at a million rows as at ten."""

    template = "(SELECT count(*) FROM (%(subquery)s) AS capped)"
    output_field = IntegerField()


def synchronous_standbys() -> tuple[str, int]:
    """The primary's ``synchronous_standby_names`` and how many standbys stream to it in
    synchronous (``sync``) or quorum (``quorum``) mode right now. ``pg_stat_replication`` shows a
    standby's ``sync_state`` only to a role with ``pg_read_all_stats`` (``pg_monitor``)."""
    names, count = execute(
        "SELECT current_setting('synchronous_standby_names'),"
        " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))",
        [],
    ).fetchone()
    return str(names), int(count)
