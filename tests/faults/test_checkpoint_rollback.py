"""Rollback detection outside the database (issue 36, item 2): the verifier keeps every
checkpoint it seals in a directory apart from the database; a restored backup that hides
later events (and the checkpoints that sealed them) is ROLLED_BACK in restore_check, naming
the run and the seq the external store knows. Real pg_dump (manage.py backup) and
pg_restore; the store's writes survive a process killed between writing and renaming."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection, connections

from ledger.models import Checkpoint, Run
from ledger.selectors import run_indicators
from ledger.services.evidence.checkpoint_store import (
    DirectoryCheckpointStore,
    ExternalCheckpoint,
    rollback_check,
)
from ledger.services.evidence.verification import run_verify
from ledger.services.fence import notes
from ledger.services.upgrades.restore import restore_check
from tests.factories import leased_run
from tests.helpers import subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
EVERY = 3


@pytest.fixture
def store_dir(settings, tmp_path):
    where = tmp_path / "checkpoints"
    settings.FENCELINE = {**settings.FENCELINE, "CHECKPOINT_EVERY": EVERY, "EXTERNAL_CHECKPOINTS": str(where)}
    return where


def _append(worker, run, token, count: int) -> None:
    for i in range(count):
        notes.event_append(worker=worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"i": i})


def _manage(database: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    url = subprocess_database_url().rsplit("/", 1)[0] + f"/{database}"
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env={**os.environ, "DATABASE_URL": url, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _pg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*args[:1], "-h", "127.0.0.1", "-U", "postgres", *args[1:]], capture_output=True, text=True)


def test_a_restored_backup_behind_the_external_checkpoints_is_rolled_back(acme, store_dir, tmp_path):
    run, token = leased_run(acme.worker, ttl_s=600)
    _append(acme.worker, run, token, 5)  # seqs 3..7
    assert run_verify(run_id=run.pk).finding is None
    store = DirectoryCheckpointStore(store_dir)
    assert store.last(str(run.pk)).seq == 6
    source = connection.settings_dict["NAME"]
    dump = tmp_path / "fenceline.dump"
    taken = _manage(source, "backup", "--output", str(dump), "--label", "before-more")
    assert taken.returncode == 0, taken.stderr

    _append(acme.worker, run, token, 5)  # seqs 8..12, sealed at 9 and 12 after the backup
    later, later_token = leased_run(acme.worker, ttl_s=600)  # a run the backup never held
    _append(acme.worker, later, later_token, 1)
    assert run_verify(run_id=run.pk).finding is None
    assert run_verify(run_id=later.pk).finding is None
    assert (store.last(str(run.pk)).seq, store.last(str(later.pk)).seq) == (12, 3)
    assert rollback_check() == []  # the live database is where the store says

    restored = f"{source}_rolled"
    _pg("dropdb", "--if-exists", restored)
    assert _pg("createdb", "-T", "template0", restored).returncode == 0
    try:
        loaded = _pg("pg_restore", "--no-owner", "-d", restored, str(dump))
        assert loaded.returncode == 0, loaded.stderr
        env = {"FENCELINE_EXTERNAL_CHECKPOINTS": str(store_dir), "FENCELINE_CHECKPOINT_EVERY": str(EVERY)}
        check = _manage(restored, "restore_check", "--by", "olga", **env)
        out = check.stdout
        assert check.returncode == 1, out + check.stderr
        assert f"PROBLEM: run {run.pk} ROLLED_BACK at seq 12: the database's head seq 7 is behind" in out
        assert f"PROBLEM: run {later.pk} ROLLED_BACK at seq 3: the database has no run {later.pk}" in out
        assert "0 BROKEN" in out  # ROLLED_BACK is its own finding, not counted again
        # The run's integrity indicator shows it (BROKEN, reason rolled_back), and the
        # verifier sealed nothing over the rollback in the restored database.
        shown = _manage(
            restored,
            "shell",
            "-c",
            "from ledger.models import Run, Checkpoint; from ledger.selectors import run_indicators; "
            f"r = Run.objects.get(pk='{run.pk}'); i = run_indicators(r)['integrity']; "
            f"print(i['value'], i['reason'], list(Checkpoint.objects.filter(run=r).values_list('seq', flat=True)))",
            **env,
        )
        line = shown.stdout.strip().splitlines()[-1]
        assert line.startswith("BROKEN rolled_back at seq 8..12: the database's head seq 7 is behind"), shown.stderr
        assert line.endswith("[3, 6]")
        # The external store was not rewritten by the restored database's verifier.
        assert store.last(str(run.pk)).seq == 12
    finally:
        connections.close_all()
        _pg("dropdb", "--if-exists", restored)


def test_without_a_rollback_restore_check_finds_none(acme, store_dir, tmp_path):
    run, token = leased_run(acme.worker, ttl_s=600)
    _append(acme.worker, run, token, 7)
    report = restore_check(by="olga", hold=False)
    assert report.rolled_back == []
    assert not [p for p in report.problems if "ROLLED_BACK" in p]
    assert DirectoryCheckpointStore(store_dir).last(str(run.pk)).seq == 9
    assert Checkpoint.objects.filter(run=run).count() == 3
    assert run_indicators(Run.objects.get(pk=run.pk))["integrity"]["value"] == "VERIFIED"
    # A backup taken after the last seal restores to no finding either.
    source = connection.settings_dict["NAME"]
    dump = tmp_path / "fenceline.dump"
    assert _manage(source, "backup", "--output", str(dump)).returncode == 0
    restored = f"{source}_whole"
    _pg("dropdb", "--if-exists", restored)
    assert _pg("createdb", "-T", "template0", restored).returncode == 0
    try:
        loaded = _pg("pg_restore", "--no-owner", "-d", restored, str(dump))
        assert loaded.returncode == 0, loaded.stderr
        check = _manage(restored, "restore_check", "--by", "olga", FENCELINE_EXTERNAL_CHECKPOINTS=str(store_dir))
        assert check.returncode == 0, check.stdout + check.stderr
        assert "ROLLED_BACK" not in check.stdout
        assert "restore check: OK" in check.stdout
    finally:
        connections.close_all()
        _pg("dropdb", "--if-exists", restored)


def test_a_rewritten_chain_is_rolled_back_at_the_seq_whose_hash_differs(acme, store_dir):
    run, token = leased_run(acme.worker, ttl_s=600)
    _append(acme.worker, run, token, 2)  # head 4
    store = DirectoryCheckpointStore(store_dir)
    store.record(
        [ExternalCheckpoint(str(run.pk), 3, "sha256:" + "0" * 64, "2026-12-06T00:00:00.000000Z", "1", "k", "m")]
    )
    [found] = rollback_check()
    assert (found.run_id, found.seq, found.first_seq) == (str(run.pk), 3, 3)
    assert "a rewritten chain" in found.detail
    report = run_verify(run_id=run.pk)
    assert (report.status, report.finding.reason, report.finding.last_seq) == ("BROKEN", "rolled_back", 3)
    assert not Checkpoint.objects.filter(run=run).exists()  # nothing sealed over it


CRASH = """
import os, sys
from pathlib import Path
from ledger.services.evidence.checkpoint_store import DirectoryCheckpointStore, ExternalCheckpoint
os.replace = lambda *args: os._exit(9)  # the process dies after the temp file's fsync, before the rename
DirectoryCheckpointStore(Path(sys.argv[-1])).record(
    [ExternalCheckpoint("RUN", 6, "sha256:" + "6" * 64, "2026-12-06T00:00:06.000000Z", "1", "k", "m")]
)
"""


def test_a_crash_mid_write_leaves_the_store_as_it_was(store_dir):
    run_id = str(uuid.uuid4())
    store = DirectoryCheckpointStore(store_dir)
    first = ExternalCheckpoint(run_id, 3, "sha256:" + "3" * 64, "2026-12-06T00:00:03.000000Z", "1", "k", "m")
    store.record([first])
    crashed = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + CRASH.replace("RUN", run_id), str(store_dir)],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "DATABASE_URL": subprocess_database_url()},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert crashed.returncode == 9, crashed.stderr
    [temp] = list(store_dir.rglob("*.tmp"))
    assert '"seq": 6' in temp.read_text()  # the new file was written whole, never renamed
    # A torn temp file from another crash, cut mid-line, is ignored as well, as is a stray
    # file beside the runs' folders.
    (store_dir / run_id / f".{9:020d}.json.torn.tmp").write_text('{"run_id": "' + run_id + '", "seq": 9, "la')
    (store_dir / "notes.txt").write_text("not a run")
    assert store.last(run_id) == first
    assert list(store.runs()) == [run_id]
    second = ExternalCheckpoint(run_id, 6, "sha256:" + "6" * 64, "2026-12-06T00:00:06.000000Z", "1", "k", "m")
    changed = ExternalCheckpoint(run_id, 3, "sha256:" + "f" * 64, "2026-12-06T00:00:07.000000Z", "1", "k", "m")
    store.record([second, changed])  # a seq already kept is kept as it was
    assert store.last(run_id) == second
    assert sorted(p.name for p in (store_dir / run_id).glob("*.json")) == [f"{3:020d}.json", f"{6:020d}.json"]
    assert '"sha256:333' in (store_dir / run_id / f"{3:020d}.json").read_text()
