"""The standalone verifier outside Fenceline: the module imports only the standard library,
and its command line verifies an export with keys files and no Django or project on the path."""

import ast
import json
import os
import subprocess
import sys

from tests.unit.reference_chain import (
    CHAIN,
    CHECKPOINTS,
    E1,
    E2,
    HASH,
    K1,
    K2,
    MODULE_PATH,
    RUN,
    export_of,
    without,
)
from tests.unit.tamper_cases import event_under_an_unknown_key_id, forged_append_without_a_mac, swap_seq

# --- the module is standard library only --------------------------------------------------


def test_module_imports_only_the_standard_library():
    tree = ast.parse(MODULE_PATH.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module.split(".")[0])
    assert imported, "the parse found the imports"
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


# --- command line ---------------------------------------------------------------------------


def run_cli(tmp_path, export: dict, *args, keys=None, event_keys=None) -> subprocess.CompletedProcess:
    export_path = tmp_path / "export.json"
    export_path.write_text(json.dumps(export, ensure_ascii=False), encoding="utf-8")
    keys_path = tmp_path / "keys.json"
    keys = keys or {"k1": "hex:" + K1.hex(), "k2": "base64:" + __import__("base64").b64encode(K2).decode()}
    keys_path.write_text(json.dumps(keys), encoding="utf-8")
    if event_keys is not None:
        (tmp_path / "event-keys.json").write_text(json.dumps(event_keys), encoding="utf-8")
        args = ("--event-keys", str(tmp_path / "event-keys.json"), *args)
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, str(MODULE_PATH), str(export_path), "--keys", str(keys_path), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_verified_unsealed_broken_and_bad_input(tmp_path):
    done = run_cli(tmp_path, export_of())
    assert done.returncode == 0, done.stderr
    assert f"run {RUN}: VERIFIED" in done.stdout
    assert "last trusted checkpoint: seq 14" in done.stdout

    done = run_cli(tmp_path, export_of(checkpoints=CHECKPOINTS[:-1]))
    assert done.returncode == 1, done.stderr
    assert "UNSEALED" in done.stdout and "last trusted checkpoint: seq 10" in done.stdout
    assert "seq 11..14" in done.stdout

    done = run_cli(tmp_path, export_of(events=without(CHAIN, 7, 8)))
    assert done.returncode == 2, done.stderr
    assert "BROKEN" in done.stdout
    assert "first bad seq: 7 (range 7..8), reason: gap" in done.stdout
    assert "last trusted checkpoint: seq 5" in done.stdout

    done = run_cli(tmp_path, export_of(events=swap_seq(CHAIN, 7)), "--json")
    assert done.returncode == 2
    report = json.loads(done.stdout)
    assert report["status"] == "BROKEN"
    assert report["finding"]["reason"] == "reorder"
    assert (report["finding"]["first_seq"], report["finding"]["last_seq"]) == (7, 8)
    assert report["last_trusted_checkpoint"] == 5

    done = run_cli(tmp_path, export_of(head=None), "--trusted", f"10:{HASH[9]}")
    assert done.returncode == 2
    assert "range 10..10), reason: fork" in done.stdout

    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(MODULE_PATH), "broken.json", "--keys", "keys.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "not valid JSON" in done.stderr

    done = run_cli(tmp_path, export_of(), keys={"k1": "plain"})
    assert done.returncode == 3
    assert "must start with 'hex:' or 'base64:'" in done.stderr

    done = run_cli(tmp_path, export_of(), "--bogus-flag")
    assert done.returncode == 3
    assert len(done.stderr.strip().splitlines()) == 1


def test_cli_does_not_need_django_or_the_project(tmp_path):
    # Copy the file alone to a clean directory and run it there, isolated (-I).
    lonely = tmp_path / "evidence_verifier.py"
    lonely.write_text(MODULE_PATH.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "export.json").write_text(json.dumps(export_of()), encoding="utf-8")
    (tmp_path / "keys.json").write_text(json.dumps({"k1": "hex:" + K1.hex()}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(lonely), "export.json", "--keys", "keys.json", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "VERIFIED"


def test_cli_checks_the_event_macs_with_event_keys_and_says_when_it_did_not(tmp_path):
    event_keys = {"e1": "hex:" + E1.hex(), "e2": "base64:" + __import__("base64").b64encode(E2).decode()}
    done = run_cli(tmp_path, export_of(), event_keys=event_keys)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"run {RUN}: VERIFIED"
    assert "event MACs: checked (14 verified)" in done.stdout

    done = run_cli(tmp_path, export_of())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"run {RUN}: VERIFIED (event MACs NOT checked: no event keys given)"
    assert "event MACs: not checked (pass --event-keys to check them)" in done.stdout

    forged, _, _ = forged_append_without_a_mac()
    head = (15, forged[-1]["hash"])
    done = run_cli(tmp_path, export_of(events=forged, head=head), "--json", event_keys=event_keys)
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["event_macs"]) == ("BROKEN", "checked")
    assert (report["finding"]["reason"], report["finding"]["first_seq"]) == ("mac_missing", 15)

    done = run_cli(tmp_path, export_of(events=forged, head=head), "--json")  # no event keys: only unsealed
    assert done.returncode == 1, done.stderr
    assert (json.loads(done.stdout)["status"], json.loads(done.stdout)["event_macs"]) == ("UNSEALED", "not_checked")

    unknown, _, _ = event_under_an_unknown_key_id()
    done = run_cli(tmp_path, export_of(events=unknown), event_keys=event_keys)
    assert done.returncode == 2
    assert "first bad seq: 8 (range 8..8), reason: mac_unknown_key_id" in done.stdout

    done = run_cli(tmp_path, export_of(), event_keys={"e1": "plain"})
    assert done.returncode == 3
    assert "must start with 'hex:' or 'base64:'" in done.stderr
