"""FENCELINE_DELIVERY_SOURCES as console/settings.py reads it: sources by name with a secret
reference (never the secret), loud failure at start-up on a bad value."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "import json, django; from django.conf import settings; django.setup(); "
    "print(json.dumps(settings.FENCELINE['DELIVERY_SOURCES']))"
)
GOOD = {"mailer": {"style": "stripe", "secret": "env:MAILER_SECRET", "tenant": "acme", "map": {"by": "message_id"}}}


def load(tmp_path, sources: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELINE_DELIVERY_")}
    env.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        FENCELINE_STATE_DIR=str(tmp_path),
        FENCELINE_DELIVERY_SOURCES=sources if isinstance(sources, str) else json.dumps(sources),
    )
    return subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_source_is_read_with_its_defaults(tmp_path):
    done = load(tmp_path, GOOD)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["mailer"]["tolerance_s"] == 300


@pytest.mark.parametrize(
    "sources, named",
    [
        ("not json", "must be a JSON object"),
        ({"Mailer!": GOOD["mailer"]}, "source name"),
        ({"mailer": {**GOOD["mailer"], "style": "svix"}}, ".style"),
        ({"mailer": {**GOOD["mailer"], "secret": "whsec_plain_value"}}, ".secret must be a reference"),
        ({"mailer": {**GOOD["mailer"], "tenant": ""}}, ".tenant"),
        ({"mailer": {**GOOD["mailer"], "map": {"by": "subject"}}}, ".map.by"),
        ({"mailer": {**GOOD["mailer"], "map": {"statuses": {"ok": "OPENED"}}}}, ".map.statuses"),
        ({"mailer": {**GOOD["mailer"], "tolerance_s": 0}}, ".tolerance_s"),
    ],
)
def test_a_bad_source_stops_start_up_naming_what_is_wrong(tmp_path, sources, named):
    done = load(tmp_path, sources)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and named in done.stderr
    assert "whsec_plain_value" not in done.stderr
