"""Shared fixtures: the suite's one cast of tenants and users, a worker-API client over
real HTTP, and the rule that a skipped test fails the run when FENCELINE_FAIL_ON_SKIP is set (CI).

The cast: the tenant ``acme`` with a worker (``acme``) and a ``viewer`` (vera), an
``operator`` (olga), an ``approver`` (alice) and an ``admin`` (ada); the outsider tenant
``globex`` with its own worker (``outsider``) and admin (``outsider_admin``, gus). A test
parametrized by role takes ``people[role]``. A test that needs someone else (a second
operator, a user with no role, a superuser) builds them with tests/factories.py."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import requests

from console.simulation.provider import SandboxProvider
from tests.factories import ROLES, WorkerIdentity, make_worker, user_with

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

# tests/ha builds pg_auto_failover formations (minutes, root for the postgres OS user):
# `make test-ha` runs them, apart from `make test`.
collect_ignore = [] if os.environ.get("FENCELINE_TEST_HA") == "1" else ["ha"]


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
def _webhook_sinks_on_loopback_allowed(settings):
    """The tests' webhook receivers (tests.helpers.Sink, the sandbox provider) listen on
    127.0.0.1, which a deployment refuses as a webhook target: the test settings name it in
    WEBHOOK_ALLOWED_HOSTS as an operator would name an internal receiver. The SSRF tests
    (tests/ledger/notifications/test_webhook_addresses.py) narrow or empty it."""
    settings.FENCELINE = {**settings.FENCELINE, "WEBHOOK_ALLOWED_HOSTS": frozenset({"127.0.0.1"})}


@pytest.fixture(autouse=True)
def _schema_phases_read_fresh():
    """Each test reads the schema changes' phases from its own database, not a process cache
    left by the test before (ledger/services/upgrades/changes.py)."""
    from ledger.services.upgrades.phases import phase_forget

    phase_forget()
    yield
    phase_forget()


# --- the cast ---------------------------------------------------------------------------


@pytest.fixture
def acme(db) -> WorkerIdentity:
    """The tenant acme's worker (worker-1)."""
    return make_worker("acme", "worker-1")


@pytest.fixture
def viewer(acme):
    return user_with("viewer", acme.tenant, "vera")


@pytest.fixture
def operator(acme):
    return user_with("operator", acme.tenant, "olga")


@pytest.fixture
def approver(acme):
    return user_with("approver", acme.tenant, "alice")


@pytest.fixture
def admin(acme):
    return user_with("admin", acme.tenant, "ada")


class People(dict):
    """acme's cast by role, each made when first asked for (``people["operator"]`` is the
    ``operator`` fixture); ``people[None]`` is a signed-up user with no role anywhere."""

    def __init__(self, request, tenant):
        super().__init__()
        self.request, self.tenant = request, tenant

    def __missing__(self, role: str | None):
        assert role is None or role in ROLES, role
        self[role] = self.request.getfixturevalue(role) if role else user_with(None, self.tenant, "nobody")
        return self[role]


@pytest.fixture
def people(request, acme) -> People:
    """For tests parametrized by role: ``people[role]``."""
    return People(request, acme.tenant)


@pytest.fixture
def outsider(db) -> WorkerIdentity:
    """The outsider tenant globex's worker (intruder)."""
    return make_worker("globex", "intruder")


@pytest.fixture
def outsider_admin(outsider):
    return user_with("admin", outsider.tenant, "gus")


# --- a provider on this machine ---------------------------------------------------------


@pytest.fixture
def sandbox(settings):
    """The sandbox payments provider over real HTTP, with its reconciler (sandbox-payments)
    configured to look up at once and give up after three attempts."""
    provider = SandboxProvider().start()
    config = {**settings.FENCELINE["RECONCILERS"]["sandbox-payments"], "base_url": provider.url}
    settings.FENCELINE = {
        **settings.FENCELINE,
        "RECONCILERS": {"sandbox-payments": config},
        "RECONCILE_AFTER_S": 0,
        "RECONCILE_BACKOFF_BASE_S": 5,
        "RECONCILE_MAX_ATTEMPTS": 3,
    }
    yield provider
    provider.stop()


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

    def leased_run(self, owner: str = "worker-a") -> str:
        """A new run whose lease this worker holds for ``owner`` (token 1)."""
        run_id = self.create_run()
        r = self.acquire(run_id, owner)
        assert r.status == 200, r
        return run_id

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
    return client, client.leased_run()


@pytest.fixture
def state_dir():
    """A state directory for an embedded PostgreSQL (FENCELINE_STATE_DIR). Not under pytest's
    tmp_path: run as root, the embedded server runs as its own system user, which must
    traverse the path, and pytest keeps its temporary root private (mode 0700), resetting
    it whenever a session starts."""
    path = Path(tempfile.mkdtemp(prefix="fenceline-state-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
