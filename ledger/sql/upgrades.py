"""The upgrades' statements: a batch of the provider_ref backfill, and a table's size as the
planner estimates it."""

from collections.abc import Sequence
from typing import Any

from django.db.models import Model

from ledger.sql.connection import execute

type Row = tuple[Any, ...]

# ``provider_ref`` agrees with ``provider`` and ``provider_request_id`` (the alias ``o`` of
# ledger_operation): the dual read's ``agrees`` in SQL. Never NULL: a missing key makes a
# comparison NULL, and ``NOT NULL`` would hide the record from the conflict read as well as
# from the move.
AGREES_SQL = """coalesce((
  (o.provider_ref IS NULL AND (o.provider_request_id = '' OR o.schema_version = 1))
  OR (o.provider_ref IS NOT NULL AND jsonb_typeof(o.provider_ref) = 'object'
      AND (o.provider_ref - 'provider' - 'id') = '{}'::jsonb
      AND jsonb_typeof(o.provider_ref -> 'id') = 'string' AND o.provider_ref ->> 'id' <> ''
      AND coalesce(jsonb_typeof(o.provider_ref -> 'provider'), 'string') = 'string'
      AND o.provider_ref ->> 'id' = o.provider_request_id
      AND (o.provider = '' OR coalesce(o.provider_ref ->> 'provider', '') = o.provider))
), false)"""

_MOVE = (
    "UPDATE ledger_operation o SET schema_version = 2, provider_ref = COALESCE(o.provider_ref, "
    "CASE WHEN o.provider_request_id = '' THEN NULL "
    "ELSE jsonb_build_object('provider', o.provider, 'id', o.provider_request_id) END) "
    f"FROM batch WHERE o.id = batch.id AND o.schema_version = 1 AND {AGREES_SQL} RETURNING o.id"
)
_WOULD_MOVE = (
    f"SELECT o.id FROM ledger_operation o JOIN batch ON batch.id = o.id WHERE o.schema_version = 1 AND {AGREES_SQL}"
)
_CONFLICTS = (
    "SELECT o.id, o.run_id, o.provider, o.provider_request_id, o.provider_ref FROM ledger_operation o "
    f"WHERE o.id > %s::uuid AND o.id <= %s::uuid AND NOT {AGREES_SQL}"
)


def provider_ref_batch(*, after: str, limit: int, dry_run: bool) -> tuple[str | None, int, int]:
    """The next ``limit`` operations after the key ``after`` ("" from the start): the
    version-1 ones whose records agree move to version 2 (with ``dry_run``, are only
    counted). (The largest key looked at, how many were looked at, how many moved.)"""
    batch = "batch AS (SELECT id FROM ledger_operation WHERE id > %s::uuid ORDER BY id LIMIT %s)"
    sql = (
        f"WITH {batch}, moved AS ({_WOULD_MOVE if dry_run else _MOVE}) "
        "SELECT (SELECT id::text FROM batch ORDER BY id DESC LIMIT 1), (SELECT count(*) FROM batch), "
        "(SELECT count(*) FROM moved)"
    )
    last_key, scanned, changed = execute(sql, [after or _BEFORE_ALL, limit]).fetchone()
    return last_key, scanned, changed


# The smallest uuid: "after" it is every operation.
_BEFORE_ALL = "00000000-0000-0000-0000-000000000000"


def provider_ref_conflicts(*, after: str, upto: str) -> Sequence[Row]:
    """(id, run id, provider, provider_request_id, provider_ref) of the operations after
    ``after`` up to ``upto`` whose two records disagree."""
    rows: Sequence[Row] = execute(_CONFLICTS, [after or _BEFORE_ALL, upto]).fetchall()
    return rows


def estimated_rows(model: type[Model]) -> int | None:
    """How many rows the table of ``model`` holds as the planner estimates it (no scan);
    None for a table never analyzed."""
    row = execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table]).fetchone()
    return int(row[0]) if row and row[0] and row[0] > 0 else None
