"""Schema migration, failure injection 4 (issue 18): a backup taken mid-migration, with mixed
schema versions, restores with pg_restore; restore_check holds the tenants' effects, and held
effects admit workers read-only until a person allows them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection, connections
from django.db.models import Count

from ledger.errors import EffectsHeld
from ledger.models import Operation
from ledger.services.fence import leases, notes, operations
from ledger.services.upgrades.backfill import backfill_run
from ledger.services.upgrades.restore import effects_allow, effects_hold
from ledger.states import Phase, UpgradePhase
from tests.factories import intended_operation, leased_run
from tests.faults.schema_change import CHANGE, move, version_one_operations
from tests.helpers import subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


# --- 4. restore a backup with mixed schema versions --------------------------------------


def _manage(database: str, *args: str) -> subprocess.CompletedProcess:
    url = subprocess_database_url().rsplit("/", 1)[0] + f"/{database}"
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_restore_a_backup_with_mixed_schema_versions(acme, tmp_path):
    version_one_operations(acme, 20)
    move(UpgradePhase.MIGRATE)
    backfill_run(CHANGE, batch_size=5, stop_after=0.5)  # a backup taken mid-migration
    mixed = dict(Operation.objects.values_list("schema_version").annotate(n=Count("pk")).order_by())
    assert set(mixed) == {1, 2}
    source = connection.settings_dict["NAME"]
    dump = tmp_path / "fenceline.dump"
    taken = _manage(source, "backup", "--output", str(dump), "--label", "mid-migration")
    assert taken.returncode == 0, taken.stderr
    manifest = json.loads(Path(f"{dump}.manifest.json").read_text())
    assert manifest["schema_versions"]["ledger.Operation"] == {str(k): v for k, v in mixed.items()}
    assert manifest["changes"][CHANGE]["phase"] == "MIGRATE"

    restored = f"{source}_restored"
    subprocess.run(["dropdb", "--if-exists", "-h", "127.0.0.1", "-U", "postgres", restored], check=True)
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", "-T", "template0", restored], check=True)
    try:
        loaded = subprocess.run(
            ["pg_restore", "-h", "127.0.0.1", "-U", "postgres", "--no-owner", "-d", restored, str(dump)],
            capture_output=True,
            text=True,
        )
        assert loaded.returncode == 0, loaded.stderr
        check = _manage(restored, "restore_check", "--by", "olga")
        assert check.returncode == 0, check.stdout + check.stderr
        assert "mixed versions: ledger.Operation" in check.stdout
        assert "the backfill moves the rest" in check.stdout
        assert "0 BROKEN" in check.stdout
        assert "effects held for acme" in check.stdout
        held = _manage(
            restored,
            "shell",
            "-c",
            "from ledger.models import Tenant; print(Tenant.objects.get(slug='acme').effects_held)",
        )
        assert held.stdout.strip().splitlines()[-1] == "True"
        # The restored database finishes its migration: the backfill resumes where the backup stood.
        resumed = _manage(restored, "backfill", CHANGE)
        assert resumed.returncode == 0, resumed.stderr
        assert "DONE" in resumed.stdout
    finally:
        connections.close_all()
        subprocess.run(["dropdb", "--if-exists", "-h", "127.0.0.1", "-U", "postgres", restored], check=False)


def test_held_effects_admit_workers_read_only_until_a_person_allows_them(acme):
    run, token = leased_run(acme.worker, ttl_s=600)
    op = intended_operation(acme.worker, run, token, "charge-3", "IDEMPOTENT")
    effects_hold(by="restore_check", tenants=["acme"], reason="restored from last night's backup")
    # Read and record: renew, events, intents.
    leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=600)
    notes.event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"after": "restore"})
    intended_operation(acme.worker, run, token, "charge-4", "IDEMPOTENT")
    with pytest.raises(EffectsHeld):
        operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    op.refresh_from_db()
    assert op.phase == Phase.PLANNED
    with pytest.raises(Exception, match="reason"):
        effects_allow(tenant="acme", name="olga", reason="")
    effects_allow(tenant="acme", name="olga", reason="restore checked: chains verified, nothing in flight")
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    op.refresh_from_db()
    assert op.phase == Phase.AUTHORIZED
