"""Slow clients cannot stall the production server: the server started the documented way
(``make serve``, docs/production.md) answers /healthz while four connections stall mid-request,
closes the stalled connections itself, and keeps its worker processes.

The bounds are generous (an answer at all within 10 s, where the sync workers did not answer
for 30 s and then were killed; the stalled sockets closed within a minute): not timing
assertions. tests/bench/slow_clients.py measures the same at K = 4, 16, 64."""

import os
import socket
import time

import pytest

from tests.bench.slow_clients import Server, Stalled, healthz
from tests.helpers import subprocess_database_url

pytestmark = pytest.mark.slow

WORKERS = 4  # console/gunicorn_conf.py
STALLED = 4


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory):
    """One server for the module, on the session's test database (it serves no query here)."""
    tmp_path = tmp_path_factory.mktemp("serve")
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SECRET_KEY": "slow-clients-test",
        "FENCELINE_STATE_DIR": str(tmp_path / "state"),
    }
    started = Server(None, env, tmp_path / "server.log")
    try:
        started.wait_ready(WORKERS)
        yield started
    finally:
        started.stop()


@pytest.mark.parametrize("kind", ["body", "headers"])
def test_four_stalled_connections_do_not_stop_healthz_nor_kill_workers(server, kind):
    workers = server.worker_pids()
    assert len(workers) == WORKERS
    stalled = [Stalled(("127.0.0.1", server.port), kind) for _ in range(STALLED)]
    for connection in stalled:
        connection.open()
    try:
        time.sleep(1)  # the stalled requests have reached the workers
        assert all(c.closed_after is None for c in stalled), "the server closed a stalled connection at once"
        answers = [healthz(server.url) for _ in range(3)]
        assert None not in answers, f"/healthz unanswered while {STALLED} clients stall: {answers}"

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(c.closed_after is None for c in stalled):
            time.sleep(0.5)
        assert all(c.closed_after is not None for c in stalled), "a stalled connection was never closed"
        if kind == "body":  # a form cut short has no CSRF token: refused, never a 500
            assert {c.answer.split(b"\r\n", 1)[0] for c in stalled} == {b"HTTP/1.1 403 Forbidden"}
        assert server.worker_pids() == workers, "gunicorn replaced a worker"
        assert healthz(server.url) is not None
    finally:
        for connection in stalled:
            connection.close()


def test_an_api_body_that_stops_arriving_is_refused_not_taken_for_the_whole(server, transactional_db):
    from ledger.models import Run
    from tests.factories import make_worker

    token = make_worker("slow", "slow-worker").token
    head = (
        f"POST /api/v1/runs HTTP/1.1\r\nHost: {server.addr}\r\nAuthorization: Bearer {token}\r\n"
        'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"schema_version": 1'
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as client:
        client.sendall(head.encode())
        answer = b""
        while chunk := client.recv(4096):  # the server closes the connection after answering
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b'"MALFORMED_JSON"' in answer and b"not received in full" in answer
    assert not Run.objects.exists()
