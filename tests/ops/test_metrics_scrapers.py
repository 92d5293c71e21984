"""Who may scrape /metrics and what each scraper sees, over HTTP against gunicorn serving the
project as docs/production.md says: behind a declared proxy every client looks like the
proxy's loopback address, so there nobody scrapes without a token; the scrape token sees
totals over the tenants (no tenant's slug anywhere), the tenant token each tenant's series."""

import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from django.db import connection

from tests.bench.http_phase import free_port
from tests.factories import make_worker
from tests.helpers import metric_value, parse_metrics

ROOT = Path(__file__).resolve().parents[2]
TOTALS_TOKEN = "totals-scrape-token-for-tests"
TENANT_TOKEN = "tenant-scrape-token-for-tests"


@contextmanager
def gunicorn(**env: str):
    """gunicorn (one sync worker, as docs/production.md runs it) on the test database."""
    db = connection.settings_dict
    port = free_port()
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FENCELINE_METRICS")},
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DJANGO_SECRET_KEY": "metrics-scrapers-test-key",
        **env,
    }
    command = [
        str(Path(sys.executable).with_name("gunicorn")),
        "console.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        "1",
        "--worker-class",
        "sync",
    ]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, env=environment, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert server.poll() is None, "gunicorn exited"
                try:
                    requests.get(url + "/healthz", timeout=10)
                    break
                except requests.RequestException:
                    time.sleep(0.2)
            yield url
        finally:
            server.terminate()
            server.wait(30)


def scrape(url: str, token: str = "", **headers: str) -> requests.Response:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return requests.get(url + "/metrics", headers=headers, timeout=30)


@pytest.fixture
def two_tenants(transactional_db):
    make_worker("acme-scraped", "worker-1")
    make_worker("globex-scraped", "worker-1")
    make_worker("globex-scraped", "worker-2")


def test_behind_a_declared_proxy_without_a_token_nobody_scrapes(two_tenants):
    with gunicorn(FENCELINE_BEHIND_TLS_PROXY="1") as url:
        for headers in ({}, {"X-Forwarded-For": "127.0.0.1"}, {"X-Forwarded-Proto": "https"}):
            refused = scrape(url, **headers)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"] == "FORBIDDEN" and "FENCELINE_METRICS_TOKEN" in refused.json()["detail"]
            assert "scraped" not in refused.text


def test_the_scrape_token_sees_totals_and_only_the_tenant_token_sees_tenants(two_tenants):
    tokens = {"FENCELINE_METRICS_TOKEN": TOTALS_TOKEN, "FENCELINE_METRICS_TENANT_TOKEN": TENANT_TOKEN}
    with gunicorn(FENCELINE_BEHIND_TLS_PROXY="1", **tokens) as url:
        for wrong in ("", "wrong", TOTALS_TOKEN + "x", TENANT_TOKEN[:-1]):
            refused = scrape(url, wrong)
            assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
        totals = scrape(url, TOTALS_TOKEN)
        assert totals.status_code == 200
        assert "scraped" not in totals.text and 'tenant="' not in totals.text
        families = parse_metrics(totals.text)
        assert metric_value(families, "fenceline_workers", status="ACCEPTING") == 3
        per_tenant = scrape(url, TENANT_TOKEN)
        assert per_tenant.status_code == 200
        families = parse_metrics(per_tenant.text)
        assert metric_value(families, "fenceline_workers", tenant="acme-scraped", status="ACCEPTING") == 1
        assert metric_value(families, "fenceline_workers", tenant="globex-scraped", status="ACCEPTING") == 2


def test_without_a_proxy_or_a_token_a_loopback_scraper_sees_totals(two_tenants):
    with gunicorn() as url:
        totals = scrape(url)
        assert totals.status_code == 200
        assert "scraped" not in totals.text and 'tenant="' not in totals.text
        assert metric_value(parse_metrics(totals.text), "fenceline_workers", status="ACCEPTING") == 3
