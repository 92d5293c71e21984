"""The production switches read from the environment: behind a TLS proxy the scheme comes from
X-Forwarded-Proto, cookies are secure, plain HTTP is redirected but the probes are not; and the
pooler switch turns server-side cursors off."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json
from django.conf import settings
from django.test import Client
print(json.dumps({
    "proxy_header": settings.SECURE_PROXY_SSL_HEADER,
    "cookies": [settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE],
    "hsts": settings.SECURE_HSTS_SECONDS,
    "trusted": settings.CSRF_TRUSTED_ORIGINS,
    "cursors_off": settings.DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"],
    "plain_login": Client().get("/accounts/login/", HTTP_HOST="127.0.0.1").status_code,
    "proxied_login": Client().get("/accounts/login/", HTTP_HOST="127.0.0.1", HTTP_X_FORWARDED_PROTO="https").status_code,
    "plain_healthz": Client().get("/healthz", HTTP_HOST="127.0.0.1").status_code,
}))
"""


def settings_with(tmp_path, **environ) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env |= {"FENCELINE_STATE_DIR": str(tmp_path), "FENCELINE_LOG_FORMAT": "plain", **environ}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_by_default_nothing_assumes_a_proxy(tmp_path):
    seen = settings_with(tmp_path)
    assert seen["proxy_header"] is None and seen["cookies"] == [False, False] and seen["hsts"] == 0
    assert seen["plain_login"] == 200 and seen["cursors_off"] is False


def test_behind_a_tls_proxy_plain_http_is_redirected_but_the_probes_answer(tmp_path):
    seen = settings_with(
        tmp_path,
        FENCELINE_BEHIND_TLS_PROXY="1",
        DJANGO_CSRF_TRUSTED_ORIGINS="https://console.example, https://ops.example",
        DB_DISABLE_SERVER_SIDE_CURSORS="1",
    )
    assert seen["proxy_header"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert seen["cookies"] == [True, True] and seen["hsts"] == 31536000
    assert seen["trusted"] == ["https://console.example", "https://ops.example"]
    assert (seen["plain_login"], seen["proxied_login"], seen["plain_healthz"]) == (301, 200, 200)
    assert seen["cursors_off"] is True
