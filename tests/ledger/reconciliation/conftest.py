"""The provider reconcilers' tests: a canary credential in the environment, the provider fakes
over real HTTP, a real IMAP server (pymap), and UNKNOWN effects whose reconciler is the
configured adapter."""

import base64
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.models import Event, Operation
from ledger.services.core.intent import Intent
from ledger.services.fence import operations, outcomes
from tests.factories import leased_run
from tests.fakes.github import FakeGitHub
from tests.fakes.slack import FakeSlack
from tests.fakes.stripe import FakeStripe

CANARY = "sk_test_CANARY7f3a9c2e1b5d4f6a8c0e2b4d6f8a"  # the secret nothing may keep
CANARY_ENV = "FENCELINE_TEST_PROVIDER_KEY"


@pytest.fixture
def canary(monkeypatch, caplog):
    """The canary secret in the environment, referenced as env:FENCELINE_TEST_PROVIDER_KEY;
    every log record, debug included, is captured for the tests to search."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(CANARY_ENV, CANARY)
    return CANARY


def configure(settings, name: str, config: dict) -> None:
    """``name`` is the only configured reconciler; lookups are due at once, three at most."""
    settings.FENCELINE = {
        **settings.FENCELINE,
        "RECONCILERS": {name: config},
        "RECONCILE_AFTER_S": 0,
        "RECONCILE_BACKOFF_BASE_S": 5,
        "RECONCILE_MAX_ATTEMPTS": 3,
    }


@pytest.fixture
def stripe(canary, settings):
    fake = FakeStripe(credential=f"Bearer {canary}").start()
    auth = {"type": "bearer", "secret": f"env:{CANARY_ENV}"}
    configure(settings, "stripe", {"kind": "stripe", "provider": "stripe", "base_url": fake.url, "auth": auth})
    yield fake
    fake.stop()


@pytest.fixture
def github(canary, settings):
    fake = FakeGitHub(credential=f"Bearer {canary}").start()
    auth = {"type": "bearer", "secret": f"env:{CANARY_ENV}"}
    configure(settings, "github", {"kind": "github", "provider": "github", "base_url": fake.url, "auth": auth})
    yield fake
    fake.stop()


@pytest.fixture
def slack(canary, settings):
    fake = FakeSlack(credential=f"Bearer {canary}").start()
    auth = {"type": "bearer", "secret": f"env:{CANARY_ENV}"}
    configure(settings, "slack", {"kind": "slack", "provider": "slack", "base_url": fake.url + "/api", "auth": auth})
    yield fake
    fake.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def imap_server():
    """A real IMAP4rev1 server (pymap's in-memory backend) on a loopback port: (host, port,
    user, password). The password is the canary: it must not leak either."""
    pymap = shutil.which("pymap", path=str(Path(sys.executable).parent)) or shutil.which("pymap")
    assert pymap, "pymap is a dev dependency (pyproject.toml)"
    port = _free_port()
    process = subprocess.Popen(
        [
            pymap,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-tls",
            "--no-service",
            "admin",
            "dict",
            "--demo-data",
            "--demo-user",
            "agent@fenceline.test",
            "--demo-password",
            CANARY,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "pymap did not start"
            time.sleep(0.1)
    yield "127.0.0.1", port, "agent@fenceline.test", CANARY
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pymap waits for open connections: end it
        process.kill()
        process.wait(timeout=5)


def unknown_effect(worker, key: str, *, provider: str, tool: str, resource: str, dispatched_ago_s: float = 0):
    """An effect at ``provider`` the worker dispatched and reported UNKNOWN: (run, op, case)."""
    run, token = leased_run(worker)
    intent = Intent(
        tool=tool,
        action="create",
        resource=resource,
        effect_class="NON_RETRYABLE",
        idempotency_key=key,
        provider=provider,
    )
    op, _ = operations.operation_intend(worker=worker, run_id=run.pk, fencing_token=token, intent=intent)
    operations.operation_authorize(worker=worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=worker, operation_id=op.pk, fencing_token=token)
    outcomes.operation_report_outcome(worker=worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN")
    if dispatched_ago_s:
        past = timezone.now() - timedelta(seconds=dispatched_ago_s)
        Operation.objects.filter(pk=op.pk).update(created_at=past, dispatched_at=past)
    op.refresh_from_db()
    return run, op, ReconciliationCase.objects.get(operation=op)


def looked_up(run) -> list[dict]:
    """The CASE_LOOKED_UP events' fields of ``run``, in order."""
    return [e.fields for e in Event.objects.filter(run=run, type="CASE_LOOKED_UP").order_by("seq")]


def due(case) -> None:
    ReconciliationCase.objects.filter(pk=case.pk).update(next_lookup_at=timezone.now() - timedelta(seconds=1))


def assert_nowhere(secret: str, *texts: str) -> None:
    """Neither ``secret`` nor its base64 (alone, or as the password of "user:secret") is in any
    table's rows or in ``texts`` (captured logs)."""
    forms = {secret, base64.b64encode(secret.encode()).decode()}
    forms |= {base64.b64encode(f"{user}:{secret}".encode()).decode() for user in ("", "agent@fenceline.test")}
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        tables = [row[0] for row in cursor.fetchall()]
        for table in tables:
            cursor.execute(f'SELECT t::text FROM "{table}" t')  # noqa: S608 - the database's own table names
            rows = "\n".join(row[0] for row in cursor.fetchall())
            for form in forms:
                assert form not in rows, f"the secret is in table {table}"
    for text in texts:
        for form in forms:
            assert form not in text, "the secret is in the logs"
    assert os.environ.get(CANARY_ENV, secret) == secret  # the reference was still there to resolve
