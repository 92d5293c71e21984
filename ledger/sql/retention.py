"""Retention of the diagnostic plane: per class, how many of a tenant's kept items are past
a cutoff, and the removal of a batch of them (oldest first, rows another removal holds
skipped). Each removal keeps the row and marks it, so a second run finds nothing more and
the verifier tells "removed by retention" from "gone"."""

from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.db import connection
from django.db.models import Model

from ledger.models import AdminAction, DiagnosticPayload, ProgressCheckpoint, Run, WorkerBoot
from ledger.sql.connection import execute


@dataclass(frozen=True)
class Kept:
    """Where a class of diagnostic data lives: ``where`` selects a tenant's kept items older
    than a cutoff (parameters: tenant id, cutoff; the table is ``t``), ``oldest`` orders
    them, ``removal`` is the SET clause (parameter: the moment of the removal)."""

    model: type[Model]
    where: str
    oldest: str
    removal: str


def _table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _payloads(klass: str) -> Kept:
    return Kept(
        DiagnosticPayload,
        f"t.tenant_id = %s AND t.created_at < %s AND t.removed_at IS NULL AND t.klass = '{klass}'",
        "t.created_at",
        "body = NULL, removed_at = %s",
    )


@cache
def _kept() -> dict[str, Kept]:
    checkpoints, boots, runs = _table(ProgressCheckpoint), _table(WorkerBoot), _table(Run)
    return {
        "event_payload": _payloads("event_payload"),
        "user_content": _payloads("user_content"),
        # A superseded checkpoint's state (the latest is what the next owner resumes from).
        "checkpoint_state": Kept(
            ProgressCheckpoint,
            f"t.run_id IN (SELECT r.id FROM {runs} r WHERE r.tenant_id = %s) AND t.created_at < %s"
            f" AND t.state_removed_at IS NULL"
            f" AND EXISTS (SELECT 1 FROM {checkpoints} l WHERE l.run_id = t.run_id AND l.seq > t.seq)",
            "t.created_at",
            "state = '{}'::jsonb, state_removed_at = %s",
        ),
        # A superseded boot's readiness evidence and error message (each domain's ok and the
        # error's kind stay: the restart episodes are counted from them).
        "boot_evidence": Kept(
            WorkerBoot,
            f"t.tenant_id = %s AND t.reported_at < %s AND t.evidence_removed_at IS NULL"
            f" AND EXISTS (SELECT 1 FROM {boots} l WHERE l.worker_id = t.worker_id AND l.reported_at > t.reported_at)",
            "t.reported_at",
            "readiness = COALESCE((SELECT jsonb_object_agg(d.key, CASE WHEN jsonb_typeof(d.value) = 'object'"
            " THEN d.value || '{\"evidence\": {}}'::jsonb ELSE d.value END) FROM jsonb_each(t.readiness) d), '{}'::jsonb),"
            " error = CASE WHEN jsonb_typeof(t.error) = 'object' THEN t.error - 'message' ELSE t.error END,"
            " evidence_removed_at = %s",
        ),
        # A quarantine decision's diagnostic bundle (the decision, its actor and reason stay).
        "bundle": Kept(
            AdminAction,
            "t.tenant_id = %s AND t.occurred_at < %s AND t.fields ? 'diagnostic_bundle'",
            "t.occurred_at",
            "fields = (t.fields - 'diagnostic_bundle') || jsonb_build_object('diagnostic_bundle_removed_at',"
            " to_char(%s::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))",
        ),
    }


def due_count(*, klass: str, tenant_id: int, cutoff: datetime) -> int:
    """How many of the tenant's kept items of ``klass`` are older than ``cutoff``."""
    kept = _kept()[klass]
    row = execute(f"SELECT count(*) FROM {_table(kept.model)} t WHERE {kept.where}", [tenant_id, cutoff]).fetchone()
    return int(row[0])


def remove(*, klass: str, tenant_id: int, cutoff: datetime, now: datetime, batch: int) -> int:
    """Remove at most ``batch`` of the tenant's kept items of ``klass`` older than
    ``cutoff``, oldest first, marking each removed at ``now``: how many."""
    kept = _kept()[klass]
    table = _table(kept.model)
    sql = (
        f"WITH due AS (SELECT t.id FROM {table} t WHERE {kept.where} ORDER BY {kept.oldest} LIMIT %s"
        f" FOR UPDATE OF t SKIP LOCKED) UPDATE {table} t SET {kept.removal} FROM due WHERE t.id = due.id"
    )
    return execute(sql, [tenant_id, cutoff, batch, now]).rowcount
