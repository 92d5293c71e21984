"""The fence's statements: the one read that locks a run with its lease (and, by operation,
reads what the write needs), the sweeps' locked runs, and the fence's generation, read
key-shared by every lease acquisition (``fence_generation_shared``), and whether this
database is the fence's home (``fence_at_home``) or a restored image of it.

Only the lease and the run rows are locked (``FOR UPDATE OF``). By operation, the operation,
its credential lease, the credential's version, the cost reservation of the current attempt
and (with ``capabilities``) the run's capability budgets for the tool are read as the
statement's snapshot saw them; ``r0``, the run as that snapshot saw it (not locked), tells
whether the statement waited for the run's lock meanwhile (its ``last_seq`` differs from the
locked row's), in which case the caller reads the operation again.
"""

import weakref
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Model

from ledger.models import (
    CapabilityBudget,
    CostReservation,
    Credential,
    CredentialLease,
    FenceGeneration,
    Operation,
    Run,
    RunLease,
    Tenant,
)
from ledger.sql.connection import database, execute
from ledger.sql.rows import column

type Row = Sequence[Any]

# The columns each part of the locking statement selects, in order.
LEASE = tuple(f.attname for f in RunLease._meta.concrete_fields)
RUN = tuple(f.attname for f in Run._meta.concrete_fields)
OPERATION = tuple(f.attname for f in Operation._meta.concrete_fields)
CREDENTIAL_LEASE = tuple(f.attname for f in CredentialLease._meta.concrete_fields)
RESERVATION = tuple(f.attname for f in CostReservation._meta.concrete_fields)
CAPABILITY = tuple(f.attname for f in CapabilityBudget._meta.concrete_fields)
TENANT = (
    "policy_version",
    "breaker_state",
    "breaker_reason",
    "breaker_changed_at",
    "effects_held",
    "effects_held_reason",
)


def _columns(alias: str, model: type[Model], names: tuple[str, ...]) -> list[str]:
    qn = connection.ops.quote_name
    return [f"{alias}.{qn(column(model, name))}" for name in names]


@cache
def _lock_sql(by_operation: bool, capabilities: bool = False) -> str:
    qn = connection.ops.quote_name
    columns = [*_columns("l", RunLease, LEASE), *_columns("r", Run, RUN), *_columns("t", Tenant, TENANT)]
    tables = f"{qn(RunLease._meta.db_table)} l JOIN {qn(Run._meta.db_table)} r ON r.id = l.run_id "
    tables += f"JOIN {qn(Tenant._meta.db_table)} t ON t.id = r.tenant_id"
    if not by_operation:
        return f"SELECT {', '.join(columns)} FROM {tables} WHERE l.run_id = %s AND r.tenant_id = %s FOR UPDATE OF l, r"
    columns += [
        "r0.last_seq",
        *_columns("o", Operation, OPERATION),
        *_columns("c", CredentialLease, CREDENTIAL_LEASE),
        "cr.version",
        *_columns("cost", CostReservation, RESERVATION),
    ]
    tables = (
        f"{qn(Operation._meta.db_table)} o JOIN {tables} ON l.run_id = o.run_id "
        f"JOIN {qn(Run._meta.db_table)} r0 ON r0.id = o.run_id "
        f"LEFT JOIN {qn(CredentialLease._meta.db_table)} c ON c.id = o.credential_lease_id "
        f"LEFT JOIN {qn(Credential._meta.db_table)} cr ON cr.id = c.credential_id "
        f"LEFT JOIN {qn(CostReservation._meta.db_table)} cost ON cost.operation_id = o.id AND cost.attempt = o.attempt"
    )
    if capabilities:
        tables += _capabilities_join()
        columns += [f"caps.c{index}" for index in range(len(CAPABILITY))]
    where = "o.id = %s AND o.tenant_id = %s AND r.tenant_id = %s"
    return f"SELECT {', '.join(columns)} FROM {tables} WHERE {where} FOR UPDATE OF l, r"


def _capabilities_join() -> str:
    """The run's capability budgets for the operation's tool, but the DENIED ones (the
    statement's first parameter), one array per column in id order."""
    qn = connection.ops.quote_name
    budget = qn(CapabilityBudget._meta.db_table)
    key = qn(column(CapabilityBudget, "id"))
    arrays = ", ".join(
        f"array_agg(cb.{qn(column(CapabilityBudget, name))} ORDER BY cb.{key}) AS c{index}"
        for index, name in enumerate(CAPABILITY)
    )
    run_column, tool, status = (qn(column(CapabilityBudget, n)) for n in ("run", "tool", "status"))
    return (
        f" LEFT JOIN LATERAL (SELECT {arrays} FROM {budget} cb WHERE cb.{run_column} = o.run_id"
        f" AND cb.{tool} = o.tool AND cb.{status} <> %s) caps ON true"
    )


def lock_run(*, run_id: object, tenant_id: object) -> Row | None:
    """The run's lease, the run and its tenant's TENANT columns, the lease and run rows
    locked until the transaction ends; None when the tenant has no such run."""
    row: Row | None = execute(_lock_sql(False), [run_id, tenant_id]).fetchone()
    return row


def lock_operation(*, operation_id: object, tenant_id: object, denied: str | None = None) -> Row | None:
    """:func:`lock_run`'s columns for the operation's run, then the run's last seq as this
    statement's snapshot saw it, the operation, its credential lease, the credential's
    version and the cost reservation of its current attempt; with ``denied`` (the status to
    leave out), the run's capability budgets for the operation's tool, one array per
    column. None when the tenant has no such operation."""
    params: list[object] = [operation_id, tenant_id, tenant_id]
    if denied is not None:
        params.insert(0, denied)
    row: Row | None = execute(_lock_sql(True, denied is not None), params).fetchone()
    return row


# What a sweep reads of a run and writes back with its chain head.
def sweep_run_columns(head: tuple[str, ...]) -> tuple[str, ...]:
    return ("id", "tenant_id", "parent_id", "status", "schema_version", *head)


@cache
def _sweep_sql(by_expiry: bool, skip_locked: bool, run_columns: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name

    def lease(name: str) -> str:
        return f"l.{qn(column(RunLease, name))}"

    columns = [lease(name) for name in LEASE]
    columns += [f"r.{qn(column(Run, name))}" for name in run_columns]
    if by_expiry:
        where = f"{lease('owner_id')} IS NOT NULL AND {lease('expires_at')} <= %s ORDER BY {lease('expires_at')}"
    else:
        where = f"{lease('run_id')} = ANY(%s::{Run._meta.pk.db_type(connection)}[]) ORDER BY {lease('run_id')}"
    return (
        f"SELECT {', '.join(columns)} FROM {qn(RunLease._meta.db_table)} l "
        f"JOIN {qn(Run._meta.db_table)} r ON r.{qn('id')} = {lease('run_id')} "
        f"WHERE {where} LIMIT %s FOR UPDATE OF {'l, r' if by_expiry else 'r'}{' SKIP LOCKED' if skip_locked else ''}"
    )


def runs_expired(*, by: datetime, limit: int | None, skip_locked: bool, run_columns: tuple[str, ...]) -> list[Row]:
    """Leases owned and expired by ``by`` (oldest expiry first, at most ``limit``) with
    ``run_columns`` of their runs, both rows locked; busy ones left out with ``skip_locked``."""
    return execute(_sweep_sql(True, skip_locked, run_columns), [by, limit]).fetchall()


def runs_by_id(
    *, run_ids: Collection[object], limit: int | None, skip_locked: bool, run_columns: tuple[str, ...]
) -> list[Row]:
    """The leases of ``run_ids`` with ``run_columns`` of their runs, the run rows locked
    (in id order when waited for); busy ones left out with ``skip_locked``."""
    ids = list(run_ids)
    return execute(_sweep_sql(False, skip_locked, run_columns), [ids, len(ids) if limit is None else limit]).fetchall()


@cache
def _generation_sql() -> str:
    qn = connection.ops.quote_name
    table, generation, key = qn(FenceGeneration._meta.db_table), qn(column(FenceGeneration, "generation")), qn("id")
    return f"SELECT {generation} FROM {table} WHERE {key} = 1 FOR KEY SHARE"


def fence_generation_shared() -> int:
    """The fence's generation (0 when it has no row), the row locked ``FOR KEY SHARE`` until
    the transaction ends: a restore moving it (``FOR UPDATE``) waits for the acquisitions
    that read it, and acquisitions that come after wait for the restore."""
    row = execute(_generation_sql(), []).fetchone()
    return 0 if row is None else int(row[0])


# The identity of the database a connection is on: the cluster's system identifier, the
# database's OID and the fence table's OID. A dump restored into a fresh database (another
# database OID), into another cluster (another system identifier) or over the same database
# with --clean (the table recreated: another table OID) differs from the one it was dumped
# from; a promoted standby of the same cluster does not (it is the same database).
@cache
def _identity_sql() -> str:
    table = FenceGeneration._meta.db_table
    return (
        "SELECT (SELECT system_identifier FROM pg_control_system())::text"
        " || ':' || (SELECT oid FROM pg_database WHERE datname = current_database())::text"
        f" || ':' || '{table}'::regclass::oid::text"
    )


def database_identity() -> str:
    """This connection's database, as ``home`` records it."""
    return str(execute(_identity_sql(), []).fetchone()[0])


@cache
def _home_sql() -> str:
    qn = connection.ops.quote_name
    table, home = qn(FenceGeneration._meta.db_table), qn(column(FenceGeneration, "home"))
    return f"SELECT {home} IN ('', ({_identity_sql()})) FROM {table} WHERE {qn('id')} = 1"


# The driver connections that found the fence at home: a connection stays on one database
# for its life, so the check costs one statement per connection, not per call.
_AT_HOME: weakref.WeakSet[object] = weakref.WeakSet()


def fence_at_home() -> bool:
    """False on a restored image whose fence ``restore_check`` has not moved; True on the
    database the fence was last moved in (or one with no home recorded, or no fence row)."""
    raw = database().connection
    if raw is not None and raw in _AT_HOME:
        return True
    row = execute(_home_sql(), []).fetchone()
    at_home = row is None or bool(row[0])
    if at_home:
        _AT_HOME.add(database().connection)
    return at_home
