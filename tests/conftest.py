"""Shared fixtures: tenants and workers, a worker-API client over real HTTP, and the
rule that a skipped test fails the run when FENCELINE_FAIL_ON_SKIP is set (CI)."""

import json
import os
import threading

import pytest
import requests
from django.db import connections

from ledger.services.fleet.workers import worker_create
from ledger.services.tenancy.tenants import tenant_ensure

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


# --- suite-wide rules ------------------------------------------------------------------


_SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("FENCELINE_FAIL_ON_SKIP") == "1" and _SKIPPED and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("FENCELINE_FAIL_ON_SKIP") == "1" and _SKIPPED:
        terminalreporter.write_line(f"FAILED: {len(_SKIPPED)} skipped test(s); CI runs every test.", red=True)


@pytest.fixture(autouse=True, scope="session")
def _tasks_run_in_process():
    """Tasks queued by services (on commit) run in-process; one test starts a real worker."""
    from console.celery import app

    app.conf.task_always_eager = True


@pytest.fixture(autouse=True)
def _schema_phases_read_fresh():
    """Each test reads the schema changes' phases from its own database, not a process cache
    left by the test before (ledger/services/upgrades/changes.py)."""
    from ledger.services.upgrades.phases import phase_forget

    phase_forget()
    yield
    phase_forget()


# --- domain fixtures --------------------------------------------------------------------


class WorkerIdentity:
    def __init__(self, worker, token):
        self.worker = worker
        self.token = token
        self.tenant = worker.tenant


def make_worker(tenant_slug: str, name: str) -> WorkerIdentity:
    tenant, _ = tenant_ensure(slug=tenant_slug)
    worker, token = worker_create(tenant=tenant, name=name)
    return WorkerIdentity(worker, token)


@pytest.fixture
def acme(db):
    return make_worker("acme", "worker-1")


@pytest.fixture
def outsider(db):
    return make_worker("globex", "intruder")


# --- worker API over HTTP ---------------------------------------------------------------


class Response:
    def __init__(self, raw: requests.Response):
        self.status = raw.status_code
        self.raw = raw
        try:
            self.body = raw.json()
        except ValueError:
            self.body = None

    def __repr__(self) -> str:
        return f"<{self.status} {self.body!r}>"


class WorkerAPI:
    """A worker talking to Fenceline over real HTTP."""

    def __init__(self, base_url: str, token: str | None):
        self.base = base_url.rstrip("/") + "/api/v1"
        self.session = requests.Session()
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def post(self, path: str, body: object = None, *, raw: bytes | None = None, timeout: float = 30) -> Response:
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return Response(
            self.session.post(
                self.base + path, data=data, headers={"Content-Type": "application/json"}, timeout=timeout
            )
        )

    def get(self, path: str, *, timeout: float = 30) -> Response:
        return Response(self.session.get(self.base + path, timeout=timeout))

    # Conveniences for the common flow.
    def create_run(self) -> str:
        r = self.post("/runs", {"schema_version": 1})
        assert r.status == 201, r
        return r.body["run_id"]

    def acquire(self, run_id: str, owner: str, ttl_s: int = 30) -> Response:
        return self.post(f"/runs/{run_id}/lease", {"owner_id": owner, "ttl_s": ttl_s})

    def intend(self, run_id: str, token: int, key: str, **overrides) -> Response:
        body = {
            "fencing_token": token,
            "tool": "email",
            "action": "send",
            "resource": "mailto:ops@example.com",
            "effect_class": "NON_RETRYABLE",
            "idempotency_key": key,
        }
        body.update(overrides)
        return self.post(f"/runs/{run_id}/operations", body)

    def authorize(self, op_id: str, token: int) -> Response:
        return self.post(f"/operations/{op_id}/authorize", {"fencing_token": token})

    def dispatch(self, op_id: str, token: int) -> Response:
        return self.post(f"/operations/{op_id}/dispatch", {"fencing_token": token})

    def outcome(self, op_id: str, token: int, outcome: str, **extra) -> Response:
        return self.post(f"/operations/{op_id}/outcome", {"fencing_token": token, "outcome": outcome, **extra})


@pytest.fixture
def api_for(live_server):
    def build(identity: WorkerIdentity | None = None, token: str | None = None) -> WorkerAPI:
        return WorkerAPI(live_server.url, identity.token if identity else token)

    return build


@pytest.fixture
def leased(api_for, acme):
    """A run of acme's worker whose lease it holds (token 1, owner "worker-a"), over HTTP."""
    client = api_for(acme)
    run_id = client.create_run()
    assert client.acquire(run_id, "worker-a").status == 200
    return client, run_id


# --- concurrency helpers ----------------------------------------------------------------


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
