"""FENCELINE_EVENT_KEYS / FENCELINE_EVENT_SIGNING_KEY_ID as console/settings.py reads them:
a keyring by id, a separate default key from the checkpoint one, loud failure on bad values."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY_A = base64.b64encode(b"A" * 32).decode()
KEY_B = base64.b64encode(b"B" * 32).decode()

SHOW = (
    "import json, django; from django.conf import settings; django.setup(); f = settings.FENCELINE; "
    "print(json.dumps({'ids': list(f['EVENT_KEYS']), 'signing': f['EVENT_SIGNING_KEY_ID'], "
    "'same_as_checkpoint': f['EVENT_KEYS'].get('local-1') == f['CHECKPOINT_KEYS'].get('local-1')}))"
)


def load(tmp_path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FENCELINE_EVENT_")}
    base.update(DJANGO_SETTINGS_MODULE="console.settings", FENCELINE_STATE_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env=base, capture_output=True, text=True, timeout=120)


def test_without_event_keys_one_local_key_apart_from_the_checkpoint_key(tmp_path):
    done = load(tmp_path, DJANGO_SECRET_KEY="a-secret-key-for-this-test-only")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ids": ["local-1"], "signing": "local-1", "same_as_checkpoint": False}


def test_event_keys_by_id_sign_with_the_last_unless_named_and_read_from_a_file(tmp_path):
    done = load(tmp_path, FENCELINE_EVENT_KEYS=f"old:{KEY_A},new:{KEY_B}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ids"] == ["old", "new"]
    assert json.loads(done.stdout)["signing"] == "new"
    (tmp_path / "keys").write_text(f"old:{KEY_A}, new:{KEY_B}\n")
    done = load(tmp_path, FENCELINE_EVENT_KEYS_FILE=str(tmp_path / "keys"), FENCELINE_EVENT_SIGNING_KEY_ID="old")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["signing"] == "old"


def test_bad_event_key_settings_fail_loudly_at_start(tmp_path):
    cases = {
        "FENCELINE_EVENT_KEYS must be 'id:base64key,...'": {"FENCELINE_EVENT_KEYS": "k1:not base64!"},
        "keys of at least 16 bytes": {"FENCELINE_EVENT_KEYS": f"k1:{base64.b64encode(b'short').decode()}"},
        "names key id 'k1' twice": {"FENCELINE_EVENT_KEYS": f"k1:{KEY_A},k1:{KEY_B}"},
        "FENCELINE_EVENT_SIGNING_KEY_ID='k9' is not among the keys (k1)": {
            "FENCELINE_EVENT_KEYS": f"k1:{KEY_A}",
            "FENCELINE_EVENT_SIGNING_KEY_ID": "k9",
        },
    }
    for message, env in cases.items():
        done = load(tmp_path, **env)
        assert done.returncode != 0, env
        assert "ImproperlyConfigured" in done.stderr and message in done.stderr, done.stderr
