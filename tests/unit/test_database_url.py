"""DATABASE_URL as console/settings.py reads it: a libpq multi-host URL (pg_auto_failover's
formation, docs/production.md "High availability") connects to the first host that accepts
writes, keeping the URL's parameters; a malformed one stops start-up naming DATABASE_URL only."""

import json
import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

from tests.served import free_port

ROOT = Path(__file__).resolve().parents[2]

SHOW = (
    "import json, django; django.setup(); from django.conf import settings; from django.db import connection; "
    "d = settings.DATABASES['default']; c = connection.cursor(); c.execute('SELECT inet_server_port()'); "
    "print(json.dumps({'host': d['HOST'], 'port': d['PORT'], 'name': d['NAME'], 'options': d['OPTIONS'], "
    "'served_by': c.fetchone()[0]}))"
)


def load(url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "DATABASE_URL": url}
    return subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_multi_host_url_connects_past_a_dead_host_to_the_one_that_answers():
    db = connection.settings_dict
    port, dead = int(db["PORT"] or 5432), free_port()  # nothing listens on ``dead``
    url = (
        f"postgresql://{db['USER'] or 'postgres'}@127.0.0.1:{dead},127.0.0.1:{port}/{db['NAME']}"
        "?target_session_attrs=read-write&connect_timeout=2"
    )
    done = load(url)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["host"] == "127.0.0.1,127.0.0.1" and shown["port"] == f"{dead},{port}"
    assert shown["options"] == {"target_session_attrs": "read-write", "connect_timeout": "2", "prepare_threshold": 2}
    assert shown["served_by"] == port


def test_a_malformed_multi_host_url_stops_start_up_without_echoing_it():
    done = load("postgresql://u:s3cret-pw@h1:1,h2:2/db?no_such_parameter=1")
    assert done.returncode != 0
    assert "DATABASE_URL cannot be parsed" in done.stderr and "s3cret-pw" not in done.stderr
