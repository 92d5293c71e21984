"""Outages answer honestly, over HTTP against gunicorn: with the database unreachable (every
connection cut and the port refusing, or the server terminating the connections) the worker API
answers 503 DATABASE_UNAVAILABLE with Retry-After and its error body, a console page a plain
503 page, /readyz 503 naming the database — never a 500 — and once the database is back the
same calls succeed. With the broker down the API keeps serving, /readyz answers 200
"degraded" (a load balancer keeps the replica) and /readyz/jobs 503 (job monitoring alerts)."""

import re
from datetime import timedelta

import psycopg
import pytest
import requests
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.utils import ConnectionHandler
from django.utils import timezone

from ledger.models import JobHeartbeat
from ledger.observability import health
from tests.factories import make_worker, user_with
from tests.served import CuttableProxy, free_port, served

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

APP_NAME = "fenceline-outage-test"


def api(server, token: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    session.base = server.url + "/api/v1"  # type: ignore[attr-defined]
    return session


def new_run(session: requests.Session) -> str:
    answer = session.post(session.base + "/runs", json={"schema_version": 1}, timeout=30)  # type: ignore[attr-defined]
    assert answer.status_code == 201, answer.text
    return answer.json()["run_id"]


def calls(session: requests.Session, run_id: str) -> list[requests.Response]:
    """A write, a read of a run, a read of the worker: each touches the database."""
    base = session.base  # type: ignore[attr-defined]
    return [
        session.post(base + "/runs", json={"schema_version": 1}, timeout=30),
        session.get(f"{base}/runs/{run_id}", timeout=30),
        session.post(base + "/workers/me/heartbeat", timeout=30),
    ]


def assert_unavailable(answer: requests.Response) -> None:
    assert answer.status_code == 503, (answer.request.method, answer.request.url, answer.status_code, answer.text[:300])
    assert answer.headers["Retry-After"] == str(settings.FENCELINE["OUTAGE_RETRY_AFTER_S"])
    assert answer.headers["Content-Type"].startswith("application/json")
    body = answer.json()
    assert body["error"] == "DATABASE_UNAVAILABLE" and body["detail"], body
    assert "5432" not in answer.text and "127.0.0.1" not in answer.text  # nothing of the DSN


def assert_served(answer: requests.Response) -> None:
    assert answer.status_code in (200, 201), (answer.request.url, answer.status_code, answer.text[:300])


def console_login(server, username: str, password: str) -> requests.Response:
    """The console's sign-in form, posted as a browser does (CSRF cookie and token)."""
    browser = requests.Session()
    page = browser.get(server.url + "/accounts/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:500]
    return browser.post(
        server.url + "/accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": server.url + "/accounts/login/"},
        allow_redirects=False,
        timeout=30,
    )


def all_jobs_fresh() -> None:
    at = timezone.now() - timedelta(seconds=1)
    for name in settings.CELERY_BEAT_SCHEDULE:
        JobHeartbeat.objects.update_or_create(name=name, defaults={"last_finished_at": at, "runs": 1})


@pytest.fixture
def proxy():
    db = connection.settings_dict
    cut = CuttableProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)))
    yield cut
    cut.close()


def test_the_database_cut_off_answers_503_with_retry_after_never_500_and_calls_succeed_once_it_is_back(proxy):
    identity = make_worker("acme", "worker-1")
    person = user_with("operator", identity.tenant, "olga")
    person.set_password("outage-test-pw")
    person.save()
    with served(database_port=proxy.port, workers=2) as server:
        session = api(server, identity.token)
        run_id = new_run(session)
        for answer in calls(session, run_id) * 2:
            assert_served(answer)
        assert console_login(server, "olga", "outage-test-pw").status_code == 302

        proxy.cut()  # open connections drop; new ones are refused
        for _ in range(5):
            for answer in calls(session, run_id):
                assert_unavailable(answer)
        page = console_login(server, "olga", "outage-test-pw")
        assert page.status_code == 503 and page.headers["Retry-After"]
        assert "cannot reach its database" in page.text
        ready = requests.get(server.url + "/readyz", timeout=30)
        assert ready.status_code == 503 and "database" in ready.json()["failing"]
        assert requests.get(server.url + "/healthz", timeout=30).status_code == 200

        proxy.restore()
        # A gunicorn worker that served nothing during the cut still holds its dead connection
        # (console/postgresql/base.py checks only an idle one): its first call fails, honestly
        # (503), and it opens a new connection for the next. So at most one 503 per worker.
        answers = [a for _ in range(8) for a in calls(session, run_id)]
        failed = [a for a in answers if a.status_code == 503]
        for answer in failed:
            assert_unavailable(answer)
        assert len(failed) <= 2, [a.status_code for a in answers]
        for answer in answers:
            if answer not in failed:
                assert_served(answer)
        logins = [console_login(server, "olga", "outage-test-pw").status_code for _ in range(3)]
        assert logins.count(302) >= 1 and set(logins) <= {302, 503}, logins


def test_connections_terminated_by_the_server_answer_503_then_the_next_call_is_served():
    identity = make_worker("acme", "worker-1")
    with served(workers=1, PGAPPNAME=APP_NAME) as server:
        session = api(server, identity.token)
        run_id = new_run(session)
        for answer in calls(session, run_id):
            assert_served(answer)
        # "terminating connection due to administrator command" (57P01), as a shutdown sends.
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname=connection.settings_dict["NAME"], autocommit=True
        ) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (APP_NAME,),
            ).fetchone()
        assert killed is not None and killed[0] == 1
        # The worker's kept connection is dead: its next call answers 503 (or, had the
        # connection sat idle long enough to be checked first, is served on a new one).
        base = session.base  # type: ignore[attr-defined]
        first = session.post(base + "/runs", json={"schema_version": 1}, timeout=30)
        if first.status_code == 503:
            assert_unavailable(first)
        else:
            assert_served(first)
        for answer in calls(session, run_id):
            assert_served(answer)


def test_the_broker_down_leaves_the_api_serving_readyz_degraded_and_the_jobs_path_failing():
    identity = make_worker("acme", "worker-1")
    all_jobs_fresh()
    nobody = free_port()  # nothing listens here
    with served(CELERY_BROKER_URL=f"redis://127.0.0.1:{nobody}/14") as server:
        session = api(server, identity.token)
        run_id = new_run(session)
        for _ in range(3):
            for answer in calls(session, run_id):
                assert_served(answer)
        ready = requests.get(server.url + "/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["status"] == "degraded" and body["failing"] == [] and body["degraded"] == ["broker"]
        assert body["checks"]["broker"]["ok"] is False
        jobs = requests.get(server.url + "/readyz/jobs", timeout=30)
        assert jobs.status_code == 503 and jobs.json()["failing"] == ["broker"]
        assert str(nobody) not in ready.text + jobs.text


def test_a_refused_or_terminated_connection_is_an_outage_and_a_statement_timeout_is_not():
    away = ConnectionHandler({"default": {**connection.settings_dict, "PORT": str(free_port())}})
    with pytest.raises(OperationalError) as refused:
        away["default"].ensure_connection()
    assert health.database_unreachable(refused.value)
    away["default"].close()

    # An administrator's shutdown of one connection (57P01), as a server stopping sends to all.
    other = ConnectionHandler({"default": dict(connection.settings_dict)})["default"]
    with other.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises((OperationalError, InterfaceError)) as terminated, other.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert health.database_unreachable(terminated.value)
    other.close()

    # A statement that fails on a live server is the server answering: not an outage (a 500).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 1")
        with pytest.raises(OperationalError) as timed_out:
            cursor.execute("SELECT pg_sleep(1)")
    assert isinstance(timed_out.value.__cause__, psycopg.errors.QueryCanceled)
    assert not health.database_unreachable(timed_out.value)
