"""The schema-migration article's failure injections (issue 18), one test each, on real
PostgreSQL with real processes where a process must die: kill a worker during the
dual-write; pause the backfill after 10 % (resume finishes it, nothing twice); change policy
between read and dispatch; restore a backup with mixed schema versions; run the migration
twice; present an old worker with a new record. And: a StateConflict stops automation on
its run only; contract refuses while an old worker is live; UNKNOWN operations are
untouched by the backfill; a backfill racing live writers leaves no record disagreeing.

The change under test is operation.provider_ref (ledger/services/upgrades/provider_ref.py).
Records written "by the old build" are written the way that build wrote them: the string id
only, schema_version 1, no provider_ref (its UPDATE never knew the new column)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection, connections
from django.db.models import Count

from approvals.models import ReconciliationCase
from ledger.errors import Denied, EffectsHeld, StateConflictError, UpgradeRefused
from ledger.models import Event, Operation, Run, StateConflict, Tenant, Worker
from ledger.services.authority.policy import policy_change
from ledger.services.core.intent import Intent
from ledger.services.fence import leases, notes, operations, outcomes
from ledger.services.fleet.boots import BootReport, worker_boot
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.backfill import backfill_pause, backfill_run
from ledger.services.upgrades.changes import change_move
from ledger.services.upgrades.conflicts import conflict_resolve
from ledger.services.upgrades.phases import phase_forget
from ledger.services.upgrades.restore import effects_allow, effects_hold
from ledger.states import BackfillState, ConflictStatus, Outcome, Phase, UpgradePhase
from tests.factories import confirm, dispatched_operation, leased_run, user_with
from tests.helpers import SPAWN, assert_chain_intact, spawned, subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)

CHANGE = provider_ref.CHANGE
ROOT = Path(__file__).resolve().parents[2]


# --- helpers ------------------------------------------------------------------------------


def move(to: str, *, fleet_upgraded: bool = True) -> None:
    """Move the change; first, unless told otherwise, every worker reports a build that reads
    version 2 (a live worker without a boot report cannot be shown to read it: MIGRATE waits)."""
    if fleet_upgraded:
        for worker in Worker.objects.all():
            if not worker.boots.filter(state_schema_version__gte=2).exists():
                booted(worker, reads=2)
    change_move(name=CHANGE, to=to, by="test", reason=f"test moves to {to}")


def booted(worker: Worker, *, reads: int, boot_id: str | None = None) -> None:
    """A boot report from the worker's process: its build reads schema versions up to ``reads``."""
    ready = {
        d: {"ok": True, "evidence": {}} for d in ("runtime", "state", "credentials", "outbound_delivery", "admission")
    }
    worker_boot(
        worker=worker,
        report=BootReport(
            boot_id=boot_id or f"boot-{worker.pk}-{reads}-{os.urandom(3).hex()}",
            config_hash="cfg-1",
            code_version=f"build-v{reads}",
            state_schema_version=reads,
            pid=4242,
            host="test-host",
            readiness=ready,
        ),
    )


def old_build_writes(op: Operation, provider_request_id: str) -> None:
    """What the build before the change stored: the string only, at version 1."""
    Operation.objects.filter(pk=op.pk).update(provider_request_id=provider_request_id, schema_version=1)


def planned(worker, run, token, key: str) -> Operation:
    op, _ = operations.operation_intend(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        intent=Intent(
            tool="email", action="send", resource="mailto:x@example.com", effect_class="IDEMPOTENT", idempotency_key=key
        ),
    )
    return op


def version_one_operations(acme, count: int) -> list[Operation]:
    """``count`` operations as the old build left them: a third with a provider id."""
    run, token = leased_run(acme.worker, ttl_s=600)
    ops = [planned(acme.worker, run, token, f"v1-{i}") for i in range(count)]
    for i, op in enumerate(ops):
        Operation.objects.filter(pk=op.pk).update(
            schema_version=1, provider_ref=None, provider_request_id=f"prov-{i}" if i % 3 == 0 else ""
        )
    return ops


def counting_touches() -> None:
    """A trigger that records every write to an operation's version or provider_ref."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS test_touch (id uuid NOT NULL)")
        cursor.execute(
            "CREATE OR REPLACE FUNCTION test_touched() RETURNS trigger AS $$ BEGIN "
            "INSERT INTO test_touch VALUES (NEW.id); RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE OR REPLACE TRIGGER test_touch_operation AFTER UPDATE ON ledger_operation FOR EACH ROW "
            "WHEN (OLD.schema_version IS DISTINCT FROM NEW.schema_version "
            "OR OLD.provider_ref IS DISTINCT FROM NEW.provider_ref) EXECUTE FUNCTION test_touched()"
        )


def touches() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id::text, count(*) FROM test_touch GROUP BY id")
        return dict(cursor.fetchall())


@pytest.fixture
def touch_counter():
    counting_touches()
    yield touches
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS test_touch_operation ON ledger_operation")
        cursor.execute("DROP TABLE IF EXISTS test_touch")


def all_agree() -> bool:
    return all(
        provider_ref.agrees(schema_version=v, provider=p, provider_request_id=r, provider_ref=ref)
        for v, p, r, ref in Operation.objects.values_list(
            "schema_version", "provider", "provider_request_id", "provider_ref"
        )
    )


# --- 1. kill a worker during the dual-write ----------------------------------------------


def _report_and_die(worker_id, op_id, token, die):
    """Report CONFIRMED with a provider id; with ``die``, SIGKILL this process after the
    dual-write's statement has gone to the database and before its COMMIT."""
    try:
        if die:
            from ledger.services.evidence.append import ChainBatch

            sent = ChainBatch.commit

            def commit_then_die(self, *args, **kwargs):
                result = sent(self, *args, **kwargs)
                if self.events and self.events[-1].type == "OPERATION_CONFIRMED":
                    os.kill(os.getpid(), signal.SIGKILL)
                return result

            ChainBatch.commit = commit_then_die
        worker = Worker.objects.get(pk=worker_id)
        outcomes.operation_report_outcome(
            worker=worker,
            operation_id=op_id,
            fencing_token=token,
            outcome=Outcome.CONFIRMED,
            provider_request_id="ch_991",
        )
    finally:
        connections.close_all()


def test_kill_a_worker_during_the_dual_write_leaves_both_representations_or_neither(acme):
    move(UpgradePhase.MIGRATE)
    run, token = leased_run(acme.worker, ttl_s=600)
    op = dispatched_operation(acme.worker, run, token, "charge-1")
    events_before = Event.objects.filter(run=run).count()

    killed = spawned("tests.faults.test_schema_migration", "_report_and_die", acme.worker.pk, str(op.pk), token, True)
    killed.join(120)
    assert killed.exitcode == -signal.SIGKILL
    op.refresh_from_db()
    # Neither representation: the transaction died with the process.
    assert (op.phase, op.provider_request_id, op.provider_ref) == (Phase.DISPATCHED, "", None)
    assert Event.objects.filter(run=run).count() == events_before

    survivor = spawned(
        "tests.faults.test_schema_migration", "_report_and_die", acme.worker.pk, str(op.pk), token, False
    )
    survivor.join(120)
    assert survivor.exitcode == 0
    op.refresh_from_db()
    # Both, agreeing, at version 2 (MIGRATE writes the new version with the old one beside it).
    assert (op.phase, op.schema_version, op.provider_request_id) == (Phase.CONFIRMED, 2, "ch_991")
    assert op.provider_ref == {"provider": op.provider, "id": "ch_991"}
    assert all_agree()
    assert_chain_intact(run.pk)


# --- 2. pause the backfill after 10 %, resume -------------------------------------------


def test_pause_the_backfill_after_ten_percent_and_resume_it_finishes_with_nothing_done_twice(acme, touch_counter):
    ops = version_one_operations(acme, 120)
    move(UpgradePhase.MIGRATE)

    paused = backfill_run(CHANGE, batch_size=6, stop_after=0.1)
    assert paused.state == BackfillState.PAUSED
    moved_first = Operation.objects.filter(schema_version=2).count()
    assert 12 <= moved_first < 120  # a tenth (in whole batches), not all
    assert paused.changed == moved_first

    resumed = backfill_run(CHANGE, batch_size=6)
    assert resumed.state == BackfillState.DONE
    assert Operation.objects.filter(schema_version=1).count() == 0
    assert resumed.changed == 120  # the counts continue from where it paused
    seen = touch_counter()
    assert set(seen) == {str(op.pk) for op in ops}
    assert max(seen.values()) == 1, "an operation was written twice"
    for i, op in enumerate(ops):
        op.refresh_from_db()
        expected = {"provider": op.provider, "id": f"prov-{i}"} if i % 3 == 0 else None
        assert op.provider_ref == expected
    assert all_agree()


def test_a_backfill_asked_to_pause_from_elsewhere_stops_after_its_batch(acme):
    version_one_operations(acme, 30)
    move(UpgradePhase.MIGRATE)
    asked = []

    def report(progress):
        if not asked:
            asked.append(backfill_pause(CHANGE).state)  # another process's `backfill --pause`

    stopped = backfill_run(CHANGE, batch_size=5, report=report)
    assert asked == [BackfillState.PAUSING]
    assert stopped.state == BackfillState.PAUSED and stopped.changed == 5
    assert backfill_run(CHANGE, batch_size=5).state == BackfillState.DONE


def test_two_backfills_cannot_run_at_once(acme):
    version_one_operations(acme, 10)
    move(UpgradePhase.MIGRATE)
    from datetime import timedelta

    from django.utils import timezone

    from ledger.models import Backfill

    Backfill.objects.update_or_create(
        name=CHANGE,
        defaults={
            "state": BackfillState.RUNNING,
            "holder": "other-host:999",
            "held_until": timezone.now() + timedelta(seconds=60),
        },
    )
    with pytest.raises(UpgradeRefused, match="other-host:999"):
        backfill_run(CHANGE)
    assert Operation.objects.filter(schema_version=2).count() == 0


# --- 3. change policy between read and dispatch ------------------------------------------


def test_a_policy_changed_between_read_and_dispatch_is_the_policy_dispatch_obeys(acme):
    run, token = leased_run(acme.worker, ttl_s=600)
    op = planned(acme.worker, run, token, "charge-2")
    operations.operation_authorize(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    # The worker has read its AUTHORIZED operation; the upgrade moves on and the policy changes.
    move(UpgradePhase.MIGRATE)
    assert backfill_run(CHANGE).state == BackfillState.DONE
    _deny_email(acme.tenant)
    with pytest.raises(Denied):
        operations.operation_dispatch(worker=acme.worker, operation_id=op.pk, fencing_token=token)
    op.refresh_from_db()
    assert op.phase == Phase.DENIED and op.fencing_token is None  # no effect, under any version
    assert op.schema_version == 2


def _deny_email(tenant: Tenant) -> None:
    from ledger.services.authority.policy import policy_current

    _, document = policy_current(tenant=tenant)
    policy_change(
        tenant=tenant,
        document={**document, "human_approval_tools": ["email"]},
        changed_by="admin",
        reason="email needs a person from now on",
    )


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
    op = planned(acme.worker, run, token, "charge-3")
    effects_hold(by="restore_check", tenants=["acme"], reason="restored from last night's backup")
    # Read and record: renew, events, intents.
    leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token, ttl_s=600)
    notes.event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"after": "restore"})
    planned(acme.worker, run, token, "charge-4")
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


# --- 5. run the migration twice ----------------------------------------------------------


def test_running_the_migration_twice_is_running_it_once(acme, touch_counter):
    version_one_operations(acme, 25)
    move(UpgradePhase.MIGRATE)
    first = backfill_run(CHANGE, batch_size=7)
    after_first = {op.pk: (op.schema_version, op.provider_ref) for op in Operation.objects.all()}
    touched_first = touch_counter()
    again = backfill_run(CHANGE, batch_size=7, restart=True)  # the whole table walked again
    assert (first.changed, again.changed) == (25, 0)
    assert again.scanned == 25
    assert {op.pk: (op.schema_version, op.provider_ref) for op in Operation.objects.all()} == after_first
    assert touch_counter() == touched_first  # not one write the second time
    # The schema migration's own data step, run again, changes nothing either.
    import importlib

    from django.apps import apps

    step = importlib.import_module("ledger.migrations.0022_upgrades_expand").change_starts_expanded
    step(apps, None)
    from ledger.models import SchemaChange

    assert list(SchemaChange.objects.values_list("name", "phase")) == [(CHANGE, UpgradePhase.MIGRATE)]
    with pytest.raises(UpgradeRefused, match="already in MIGRATE"):
        move(UpgradePhase.MIGRATE)


# --- 6. present an old worker with a new record ------------------------------------------


def test_an_old_worker_meets_a_new_record_and_refuses_it_safely(acme, live_server):
    from fenceline_client import Client, Done, NotReady, UnknownSchemaVersion

    move(UpgradePhase.MIGRATE)
    old = Client(live_server.url, acme.token, reads=frozenset({1}))
    # Its boot says it reads up to version 1: the server does not admit it to meet version 2.
    booted_answer = old.boot(config_hash="cfg", code_version="build-v1", readiness=_ready(), honour_delay=False)
    assert "state" in booted_answer["failed_domains"]
    run_id = old.create_run()
    with pytest.raises(NotReady):
        old.lease(run_id, ttl_s=60).__enter__()
    # A worker that never reported a boot gets as far as the record, and refuses it there.
    Worker.objects.filter(pk=acme.worker.pk).update(boot_phase="", not_ready_code="")
    performed = []
    with old.lease(run_id, ttl_s=60) as lease, pytest.raises(UnknownSchemaVersion):
        lease.operation(
            tool="email",
            action="send",
            resource="mailto:x@example.com",
            effect_class="IDEMPOTENT",
            idempotency_key="new-record-1",
            perform=lambda: performed.append(1) or Done(provider_request_id="x"),
        )
    assert performed == []
    op = Operation.objects.get(idempotency_key="new-record-1")
    assert (op.schema_version, op.phase) == (2, Phase.PLANNED)  # nothing went further


def _ready() -> dict:
    return {
        d: {"ok": True, "evidence": {}} for d in ("runtime", "state", "credentials", "outbound_delivery", "admission")
    }


# --- a StateConflict stops automation on that run only ------------------------------------


def test_a_state_conflict_stops_automation_on_its_run_and_only_a_person_ends_it(acme):
    conflicted_run, token_a = leased_run(acme.worker, owner="a", ttl_s=600)
    healthy_run, token_b = leased_run(acme.worker, owner="b", ttl_s=600)
    op_a = dispatched_operation(acme.worker, conflicted_run, token_a, "a-1")
    confirm(acme.worker, op_a, token_a, "ch_1")
    # A rolling deploy: an old-build process rewrites the string and never knew provider_ref.
    old_build_writes(op_a, "ch_2")
    move(UpgradePhase.MIGRATE)
    done = backfill_run(CHANGE)
    assert done.conflicts == 1
    conflict = StateConflict.objects.get(status=ConflictStatus.OPEN)
    assert conflict.record == f"operation:{op_a.pk}"
    assert conflict.old_value["provider_request_id"] == "ch_2" and conflict.new_value["id"] == "ch_1"
    op_a.refresh_from_db()
    assert op_a.schema_version == 1  # not moved: nothing picks a side

    with pytest.raises(StateConflictError):
        notes.event_append(worker=acme.worker, run_id=conflicted_run.pk, fencing_token=token_a, type="NOTE", fields={})
    with pytest.raises(StateConflictError):
        planned(acme.worker, conflicted_run, token_a, "a-2")
    with pytest.raises(StateConflictError):
        leases.lease_renew(worker=acme.worker, run_id=conflicted_run.pk, owner_id="a", fencing_token=token_a, ttl_s=600)
    # The other run goes on.
    op_b = dispatched_operation(acme.worker, healthy_run, token_b, "b-1")
    assert op_b.phase == Phase.DISPATCHED

    operator = user_with("operator", acme.tenant, "olga")
    with pytest.raises(Exception, match="reason"):
        conflict_resolve(conflict_id=conflict.pk, user=operator, choice="old", reason=" ")
    with pytest.raises(Exception, match="choice"):
        conflict_resolve(conflict_id=conflict.pk, user=operator, choice="whichever", reason="x")
    conflict_resolve(conflict_id=conflict.pk, user=operator, choice="old", reason="the provider's dashboard shows ch_2")
    op_a.refresh_from_db()
    assert (op_a.provider_request_id, op_a.provider_ref) == ("ch_2", {"provider": op_a.provider, "id": "ch_2"})
    assert Run.objects.get(pk=conflicted_run.pk).open_conflicts == 0
    notes.event_append(worker=acme.worker, run_id=conflicted_run.pk, fencing_token=token_a, type="NOTE", fields={})
    types = list(Event.objects.filter(run=conflicted_run).values_list("type", "actor"))
    assert ("STATE_CONFLICT_OPENED", "system:upgrade") in types
    assert ("STATE_CONFLICT_RESOLVED", "user:olga") in types
    assert_chain_intact(conflicted_run.pk)
    assert backfill_run(CHANGE, restart=True).changed == 1  # now it moves


# --- contract waits for the fleet ----------------------------------------------------------


def test_contract_refuses_while_an_old_worker_is_live(acme):
    version_one_operations(acme, 5)
    booted(acme.worker, reads=1)  # live, on the old build
    with pytest.raises(UpgradeRefused, match="live worker"):
        move(UpgradePhase.MIGRATE, fleet_upgraded=False)
    booted(acme.worker, reads=2)
    move(UpgradePhase.MIGRATE, fleet_upgraded=False)
    with pytest.raises(UpgradeRefused, match="still at schema_version 1"):
        move(UpgradePhase.CONTRACT, fleet_upgraded=False)
    assert backfill_run(CHANGE).state == BackfillState.DONE
    booted(acme.worker, reads=1)  # a rollback of the worker's build
    with pytest.raises(UpgradeRefused, match="worker-1 \\(build build-v1, reads up to v1\\)"):
        move(UpgradePhase.CONTRACT, fleet_upgraded=False)
    booted(acme.worker, reads=2)
    move(UpgradePhase.CONTRACT, fleet_upgraded=False)
    phase_forget()
    run, token = leased_run(acme.worker, owner="after", ttl_s=600)
    op = dispatched_operation(acme.worker, run, token, "after-contract")
    confirm(acme.worker, op, token, "ch_9")
    op.refresh_from_db()
    # Contracted: only the new representation is written.
    assert (op.schema_version, op.provider_request_id, op.provider_ref) == (
        2,
        "",
        {"provider": op.provider, "id": "ch_9"},
    )
    with pytest.raises(UpgradeRefused, match="no way back"):
        move(UpgradePhase.MIGRATE)


# --- UNKNOWN stays UNKNOWN ---------------------------------------------------------------


def test_unknown_operations_are_untouched_by_the_backfill(acme):
    run, token = leased_run(acme.worker, ttl_s=600)
    unknown = []
    for i in range(6):
        op = dispatched_operation(acme.worker, run, token, f"u-{i}")
        outcomes.operation_report_outcome(
            worker=acme.worker,
            operation_id=op.pk,
            fencing_token=token,
            outcome=Outcome.UNKNOWN,
            provider_request_id=f"maybe-{i}" if i % 2 else "",
        )
        old_build_writes(op, f"maybe-{i}" if i % 2 else "")
        Operation.objects.filter(pk=op.pk).update(provider_ref=None)
        unknown.append(op.pk)
    kept = ("phase", "attempt", "fencing_token", "provider_request_id", "reconciliation", "actual_cost_cents")
    before = {o["id"]: o for o in Operation.objects.filter(pk__in=unknown).values("id", *kept)}
    cases_before = dict(
        ReconciliationCase.objects.filter(operation_id__in=unknown).values_list("operation_id", "status")
    )
    events_before = Event.objects.filter(run=run).count()
    move(UpgradePhase.MIGRATE)
    assert backfill_run(CHANGE, batch_size=2).state == BackfillState.DONE
    after = {o["id"]: o for o in Operation.objects.filter(pk__in=unknown).values("id", *kept)}
    assert after == before
    assert {o.phase for o in Operation.objects.filter(pk__in=unknown)} == {Phase.UNKNOWN}
    assert (
        dict(ReconciliationCase.objects.filter(operation_id__in=unknown).values_list("operation_id", "status"))
        == cases_before
    )
    assert Event.objects.filter(run=run).count() == events_before  # the backfill writes no event
    assert set(Operation.objects.filter(pk__in=unknown).values_list("schema_version", flat=True)) == {2}


# --- a backfill racing live writers -------------------------------------------------------


def _report_many(worker_id, pairs, barrier):
    try:
        worker = Worker.objects.get(pk=worker_id)
        barrier.wait(120)
        for op_id, token in pairs:
            outcomes.operation_report_outcome(
                worker=worker,
                operation_id=op_id,
                fencing_token=token,
                outcome=Outcome.CONFIRMED,
                provider_request_id=f"r-{op_id[:8]}",
            )
    finally:
        connections.close_all()


def _backfill(barrier):
    try:
        barrier.wait(120)
        backfill_run(CHANGE, batch_size=3)
    finally:
        connections.close_all()


def test_a_backfill_racing_live_writers_leaves_no_record_disagreeing(acme):
    version_one_operations(acme, 30)
    runs = [leased_run(acme.worker, owner=f"w-{i}", ttl_s=600) for i in range(2)]
    live = [
        [(str(dispatched_operation(acme.worker, run, token, f"live-{n}-{i}").pk), token) for i in range(12)]
        for n, (run, token) in enumerate(runs)
    ]
    # The writers are mid-expand: their operations are at version 1 when the migration starts.
    Operation.objects.filter(idempotency_key__startswith="live-").update(schema_version=1)
    move(UpgradePhase.MIGRATE)
    barrier = SPAWN.Barrier(3)
    racers = [
        spawned("tests.faults.test_schema_migration", "_report_many", acme.worker.pk, pairs, barrier) for pairs in live
    ]
    racers.append(spawned("tests.faults.test_schema_migration", "_backfill", barrier))
    for racer in racers:
        racer.join(240)
        assert racer.exitcode == 0
    assert all_agree()
    assert not StateConflict.objects.exists()
    assert backfill_run(CHANGE, restart=True).state == BackfillState.DONE
    assert Operation.objects.filter(schema_version=1).count() == 0
    assert set(Operation.objects.filter(idempotency_key__startswith="live-").values_list("phase", flat=True)) == {
        Phase.CONFIRMED
    }
