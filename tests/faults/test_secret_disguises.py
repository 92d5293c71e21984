"""The secret boundary under disguise (issue 35, item 1).

One test per disguise class of ``tests/faults/secret_probes.py``: the class goes into every
free-text field of every worker-API endpoint that takes text (and into the URL's path and
query), each probe with its own random credential; every probe is refused with 422, and
afterwards no probe's credential, raw or as sent, is in any row of any table or in anything
the configured log handlers printed. One class also goes through the production server
(gunicorn, as docs/production.md runs it), reading its database and its log bytes; the
console's forms are judged the same way.
"""

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.db import connection
from django.test import Client

from tests.factories import make_worker, user_with
from tests.faults import secret_probes as sp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def printed_logs():
    logs = sp.PrintedLogs()
    yield logs
    logs.close()


@pytest.fixture
def new_worker(db):
    made = []

    def build() -> sp.Worker:
        made.append(make_worker("acme", f"probe-{len(made)}"))
        return sp.Worker(made[-1].token)

    return build


def assert_refused_and_nowhere(probes: list[sp.Probe], logs: sp.PrintedLogs) -> None:
    assert probes
    statuses = {(probe.field, probe.status) for probe in probes if probe.status != 422}
    assert statuses == set(), "every probe is refused with 422"
    table = sp.tally(probes, sp.database_text(), logs.text())
    assert {name: (row.stored, row.logged, sorted(row.fields_stored)) for name, row in table.items()} == {
        name: (0, 0, []) for name in table
    }


@pytest.mark.parametrize("disguise", list(sp.DISGUISES))
def test_a_disguised_credential_is_refused_in_every_field(new_worker, printed_logs, disguise):
    probes = sp.send_probes(new_worker, 1, [disguise])
    fields = {probe.field for probe in probes}
    assert len(fields) >= (12 if disguise == sp.SPLIT else 24), fields
    assert_refused_and_nowhere(probes, printed_logs)


def test_a_credential_in_the_worker_events_type_is_refused(new_worker, printed_logs):
    probes = sp.send_probes(new_worker, 2, ["event type"])
    assert {probe.field for probe in probes} == {"event.type"}
    assert_refused_and_nowhere(probes, printed_logs)


def test_measure_every_class_in_every_field(new_worker, printed_logs):
    """The measurement: FENCELINE_PROBES_PER_CLASS probes (default 1) of each class in each
    field; prints the table (run with -s)."""
    per_class = int(os.environ.get("FENCELINE_PROBES_PER_CLASS", "1"))
    probes = sp.send_probes(new_worker, per_class)
    table = sp.tally(probes, sp.database_text(), printed_logs.text())
    print("\n" + sp.render(table))
    leaked = {name: (row.stored, row.logged) for name, row in table.items() if row.stored or row.logged}
    assert leaked == {}


def test_every_probed_field_stores_ordinary_text(new_worker, printed_logs):
    """The probes reach live fields: an ordinary unique marker in each is accepted and stored,
    and ordinary text split over two fields is not mistaken for a credential."""
    worker = new_worker()
    markers = {}
    for name, (send, two_fields) in sp.FIELDS.items():
        if name.startswith("url."):
            continue
        marker = f"marker-{sp.core()[2:14].lower()}"
        w = new_worker() if name in sp.FRESH_WORKER else worker
        status, body = send(w, marker, f"second-{marker}" if two_fields else None)
        assert status in (200, 201), (name, status, body)
        markers[name] = marker
    stored = sp.database_text().lower()
    assert [name for name, marker in markers.items() if marker not in stored] == []


def test_a_refusal_names_both_fields_of_a_split_credential(new_worker, printed_logs):
    worker = new_worker()
    key = sp.stripe(sp.core())
    status, body = sp.event(worker, {"memo": "deploy", "first": key[:14], "second": key[14:]})
    assert status == 422, body
    assert body["error"] == "FORBIDDEN_FIELD" and body["rule"] == "credential-like value"
    assert "fields.first" in body["detail"] and body["path"] == "fields.second"
    assert key[8:14].lower() not in str(body).lower()


# --- console forms ---------------------------------------------------------------------------


@pytest.mark.parametrize("disguise", ["homoglyph (Cyrillic \u043a in sk_live_)", "base64 of the key", sp.SPLIT])
def test_a_console_form_carrying_a_disguised_credential_stores_nothing(acme, printed_logs, disguise):
    admin = user_with("admin", acme.tenant, "ada-probe")
    browser = Client()
    browser.force_login(admin)
    c = sp.core()
    made = sp.DISGUISES[disguise](c)
    first, second = made if isinstance(made, tuple) else (made, "rotating keys")
    r = browser.post(
        f"/tenants/{acme.tenant.slug}/webhooks/create",
        {"name": first, "target": "https://hooks.example.com/x", "kinds": ["quarantine"], "unknown_after_min": "20"}
        | {"reason": second},
    )
    assert r.status_code == 422, r.status_code
    assert b"credential-like value" in r.content
    probe = sp.Probe(disguise, "console webhook", [c, first, second], 422)
    assert sp.tally([probe], sp.database_text(), printed_logs.text())[disguise].stored == 0
    assert sp.tally([probe], sp.database_text(), printed_logs.text())[disguise].logged == 0


def test_an_ordinary_console_form_still_passes_the_boundary(acme, printed_logs):
    admin = user_with("admin", acme.tenant, "ada-probe")
    browser = Client()
    browser.force_login(admin)
    r = browser.post(
        f"/tenants/{acme.tenant.slug}/webhooks/create",
        {
            "name": "ops-pager",
            "target": "https://hooks.example.com/fenceline",
            "kinds": ["quarantine"],
            "unknown_after_min": "20",
            "reason": "page the on-call engineer; basic setup, token 12 of the plan",
        },
    )
    assert r.status_code in (200, 201, 302), r.status_code
    assert "ops-pager" in sp.database_text()


# --- the production server ------------------------------------------------------------------


@pytest.fixture
def gunicorn(transactional_db):
    """gunicorn serving the project as docs/production.md runs it (sync workers), against the
    test database; its stdout and stderr (every log line it prints) go to a file."""
    port = _free_port()
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DJANGO_SECRET_KEY": "probe-" + uuid.uuid4().hex,
        "FENCELINE_LOG_LEVEL": "DEBUG",
    }
    command = [str(Path(sys.executable).with_name("gunicorn")), "console.wsgi:application"]
    command += ["--bind", f"127.0.0.1:{port}", "--workers", "2", "--worker-class", "sync"]
    log = tempfile.TemporaryFile()  # noqa: SIM115 - read after the server stops
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "gunicorn exited"
        try:
            if requests.get(base + "/healthz", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.2)
    connection.close()  # the server's workers see every committed row; this test's reads reconnect
    yield base, process, log
    process.terminate()
    process.wait(15)
    log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HTTPWorker(sp.Worker):
    """The probes' worker over real HTTP to the production server."""

    def __init__(self, base: str, token: str) -> None:
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.base = base
        self.client = self  # url_path / url_query call client.get

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        r = self.session.post(self.base + "/api/v1" + path, json=body, timeout=30)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, {}

    def get(self, path: str):
        return self.session.get(self.base + path, timeout=30)


@pytest.mark.parametrize("disguise", ["Hangul filler U+3164", sp.SPLIT, "percent-encoded 4 times"])
def test_disguised_credentials_over_the_production_server_are_stored_and_logged_nowhere(gunicorn, disguise):
    base, process, log = gunicorn
    made = []

    def new_worker() -> sp.Worker:
        made.append(make_worker("acme", f"http-probe-{len(made)}"))
        return HTTPWorker(base, made[-1].token)

    probes = sp.send_probes(new_worker, 1, [disguise])
    process.terminate()
    process.wait(15)
    log.seek(0)
    printed = log.read().decode("utf-8", "replace")
    assert "POST api/v1/runs" in printed  # the log is the server's (one line per request)
    statuses = {(probe.field, probe.status) for probe in probes if probe.status != 422}
    assert statuses == set()
    table = sp.tally(probes, sp.database_text(), printed)
    assert (table[disguise].stored, table[disguise].logged) == (0, 0), table[disguise]
