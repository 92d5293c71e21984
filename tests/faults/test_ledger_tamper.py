"""The tamper matrices of "Logs Are Not an Audit Trail" and "Audit Trail Is Not Evidence",
one test per row, against the real stored rows (tampered with raw SQL after switching off
the append-only trigger). Each asserts the exact seq range and reason from the in-app
verifier, that the standalone verifier says the same about the HTTP export, and that
nothing reports VERIFIED."""

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from approvals.models import ReconciliationCase
from ledger.chain import canonical_bytes, format_time, hash_bytes
from ledger.models import Checkpoint, Event, Operation, Run
from ledger.services.evidence.verification import run_verify
from tests.faults.test_races import expire_lease
from tests.helpers import tampering

STANDALONE = Path(__file__).resolve().parents[2] / "ledger" / "evidence_verifier.py"
K1 = b"k1-secret-for-tamper-tests-0001!"
K2 = b"k2-secret-for-tamper-tests-0002!"

# The scenario's chain, pinned so every row below names real seqs.
CHAIN = [
    "RUN_CREATED",  # 1
    "LEASE_ACQUIRED",  # 2  worker A, token 1
    "OPERATION_PLANNED",  # 3  op1
    "OPERATION_AUTHORIZED",  # 4
    "OPERATION_DISPATCHED",  # 5
    "OPERATION_CONFIRMED",  # 6
    "OPERATION_PLANNED",  # 7  op2
    "OPERATION_AUTHORIZED",  # 8
    "OPERATION_DISPATCHED",  # 9
    "NOTE",  # 10
    "LEASE_EXPIRED",  # 11 A's lease lapses; B takes over
    "OPERATION_UNKNOWN",  # 12 op2
    "LEASE_ACQUIRED",  # 13 worker B, token 2
    "NOTE",  # 14
    "x.summary",  # 15
    "LEASE_RELEASED",  # 16 completion ends the lease
    "RUN_COMPLETED",  # 17
]
HEAD = len(CHAIN)


@pytest.fixture
def keys(settings):
    settings.FENCELINE = {
        **settings.FENCELINE,
        "CHECKPOINT_EVERY": 5,
        "CHECKPOINT_KEYS": {"k1": K1},
        "CHECKPOINT_SIGNING_KEY_ID": "k1",
    }
    return settings


@pytest.fixture
def scenario(api_for, acme, keys):
    a, b = api_for(acme), api_for(acme)
    run_id = a.create_run()
    a.acquire(run_id, "worker-a")
    op1 = a.intend(run_id, 1, "deploy:1", effect_class="IDEMPOTENT", resource="repo:acme/api").body["operation_id"]
    a.authorize(op1, 1)
    a.dispatch(op1, 1)
    a.outcome(op1, 1, "CONFIRMED", provider_request_id="dep-1")
    op2 = a.intend(run_id, 1, "email:2").body["operation_id"]
    a.authorize(op2, 1)
    a.dispatch(op2, 1)
    a.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"step": "waiting"}})
    expire_lease(run_id)
    assert b.acquire(run_id, "worker-b").body["fencing_token"] == 2
    b.post(f"/runs/{run_id}/events", {"fencing_token": 2, "type": "NOTE", "fields": {"step": "took over"}})
    b.post(f"/runs/{run_id}/events", {"fencing_token": 2, "type": "x.summary", "fields": {"ok": False}})
    assert b.post(f"/runs/{run_id}/complete", {"fencing_token": 2}).status == 200

    assert list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True)) == CHAIN
    # Completion queued the verifier, which sealed every 5 events and the terminal head.
    assert list(Checkpoint.objects.filter(run_id=run_id).values_list("seq", "key_id")) == [
        (5, "k1"),
        (10, "k1"),
        (15, "k1"),
        (17, "k1"),
    ]
    assert verify_in_app(run_id) == ("VERIFIED", None, 17)
    return {"run_id": run_id, "client": b, "op2": op2}


def sql(statement: str, params=()) -> None:
    with tampering() as cursor:
        cursor.execute(statement, params)


def verify_in_app(run_id):
    report = run_verify(run_id=run_id, seal=False)
    finding = report.finding and (report.finding.reason, report.finding.first_seq, report.finding.last_seq)
    return report.status, finding, report.last_trusted_checkpoint


def verify_standalone(client, run_id, tmp_path, keys=None):
    export = client.get(f"/runs/{run_id}/events")
    assert export.status == 200
    (tmp_path / "export.json").write_bytes(export.raw.content)
    keyring = keys or {"k1": K1}
    (tmp_path / "keys.json").write_text(
        json.dumps({k: "base64:" + base64.b64encode(v).decode() for k, v in keyring.items()})
    )
    run = Run.objects.get(pk=run_id)
    args = [
        sys.executable,
        "-I",
        str(STANDALONE),
        str(tmp_path / "export.json"),
        "--keys",
        str(tmp_path / "keys.json"),
        "--json",
    ]
    if run.trusted_seq:
        args += ["--trusted", f"{run.trusted_seq}:{run.trusted_hash}"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode in (0, 1, 2), done.stderr
    report = json.loads(done.stdout)
    finding = report["finding"] and (
        report["finding"]["reason"],
        report["finding"]["first_seq"],
        report["finding"]["last_seq"],
    )
    return report["status"], finding, report["last_trusted_checkpoint"]


def assert_both(scenario, tmp_path, status, finding, trusted_checkpoint):
    run_id = scenario["run_id"]
    expected = (status, finding, trusted_checkpoint)
    assert verify_in_app(run_id) == expected
    assert verify_standalone(scenario["client"], run_id, tmp_path) == expected
    assert status != "VERIFIED"


def test_deleted_event_is_a_gap(scenario, tmp_path):
    sql("DELETE FROM ledger_event WHERE run_id = %s AND seq = 7", [scenario["run_id"]])
    assert_both(scenario, tmp_path, "BROKEN", ("gap", 7, 7), 5)


def test_swapped_events_are_a_reorder(scenario, tmp_path):
    run_id = scenario["run_id"]
    for source, target in ((7, 1_000_007), (8, 7), (1_000_007, 8)):
        sql("UPDATE ledger_event SET seq = %s WHERE run_id = %s AND seq = %s", [target, run_id, source])
    assert_both(scenario, tmp_path, "BROKEN", ("reorder", 7, 8), 5)


def test_mutated_field_is_detected(scenario, tmp_path):
    sql(
        "UPDATE ledger_event SET fields = jsonb_set(fields, '{resource}', '\"repo:evil/api\"') "
        "WHERE run_id = %s AND seq = 3",
        [scenario["run_id"]],
    )
    assert_both(scenario, tmp_path, "BROKEN", ("mutated", 3, 3), None)


@pytest.fixture
def event_id_not_unique(db):
    """Drop the database's uniqueness of event ids, so that the verifier is what catches a
    duplicate; restored (after removing the copies) when the test ends."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'ledger_event'::regclass "
            "AND contype = 'u' AND pg_get_constraintdef(oid) = 'UNIQUE (event_id)'"
        )
        (name,) = cursor.fetchone()
        cursor.execute(f"ALTER TABLE ledger_event DROP CONSTRAINT {name}")
    yield
    with tampering() as cursor:
        cursor.execute(
            "DELETE FROM ledger_event WHERE id IN (SELECT max(id) FROM ledger_event GROUP BY event_id HAVING count(*) > 1)"
        )
        cursor.execute(f"ALTER TABLE ledger_event ADD CONSTRAINT {name} UNIQUE (event_id)")


def _forge(run_id: str, seq: int, *, event_id: str, type: str, fields: dict, prev_hash: str) -> str:
    """Insert an event hashed and linked exactly as Fenceline would, and move the run head
    to it: an attacker who knows the algorithm but not the checkpoint key."""
    template = Event.objects.filter(run_id=run_id).order_by("-seq").first()
    occurred_at = format_time(template.occurred_at)
    digest = hash_bytes(
        canonical_bytes(
            run_id=run_id,
            seq=seq,
            event_id=event_id,
            type=type,
            schema_version=1,
            actor=template.actor,
            occurred_at=occurred_at,
            fields=fields,
            prev_hash=prev_hash,
        )
    )
    sql(
        "INSERT INTO ledger_event (run_id, seq, event_id, type, actor, occurred_at, fields, prev_hash, hash, schema_version) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, 1)",
        [run_id, seq, event_id, type, template.actor, template.occurred_at, json.dumps(fields), prev_hash, digest],
    )
    Run.objects.filter(pk=run_id).update(last_seq=seq, last_hash=digest)
    return digest


def test_duplicate_event_id_is_reported_not_counted_twice(scenario, tmp_path, event_id_not_unique):
    run_id = scenario["run_id"]
    original = Event.objects.get(run_id=run_id, seq=14)
    head = Event.objects.get(run_id=run_id, seq=HEAD)
    _forge(
        run_id,
        HEAD + 1,
        event_id=str(original.event_id),
        type=original.type,
        fields=original.fields,
        prev_hash=head.hash,
    )
    assert_both(scenario, tmp_path, "BROKEN", ("duplicate", 18, 18), 17)


def test_fake_confirmation_of_an_unknown_effect_is_an_illegal_transition(scenario, tmp_path):
    run_id, op2 = scenario["run_id"], scenario["op2"]
    head = Event.objects.get(run_id=run_id, seq=HEAD)
    fields = {"operation_id": op2, "from": "UNKNOWN", "to": "CONFIRMED", "attempt": 1, "provider_request_id": "fake-1"}
    _forge(
        run_id,
        HEAD + 1,
        event_id="00000000-0000-4000-8000-000000000018",
        type="OPERATION_CONFIRMED",
        fields=fields,
        prev_hash=head.hash,
    )
    assert_both(scenario, tmp_path, "BROKEN", ("illegal_transition", 18, 18), 17)
    assert Operation.objects.get(pk=op2).phase == "UNKNOWN"


def test_removed_final_checkpoint_leaves_the_run_unsealed(scenario, tmp_path):
    sql("DELETE FROM ledger_checkpoint WHERE run_id = %s AND seq = %s", [scenario["run_id"], HEAD])
    assert_both(scenario, tmp_path, "UNSEALED", None, 15)


def test_restored_older_checkpoint_is_a_rollback(scenario, tmp_path):
    run_id = scenario["run_id"]
    cp15 = Checkpoint.objects.get(run_id=run_id, seq=15)
    # An older backup restored: the events and checkpoint after seq 15 are gone, the run
    # head says 15 again. The verifier had trusted seq 17.
    sql("DELETE FROM ledger_event WHERE run_id = %s AND seq > 15", [run_id])
    sql("DELETE FROM ledger_checkpoint WHERE run_id = %s AND seq > 15", [run_id])
    Run.objects.filter(pk=run_id).update(last_seq=15, last_hash=cp15.last_hash)
    assert_both(scenario, tmp_path, "BROKEN", ("rollback", 16, 17), 15)


def test_checkpoint_with_a_forged_mac_is_a_mismatch(scenario, tmp_path):
    sql(
        "UPDATE ledger_checkpoint SET mac = %s WHERE run_id = %s AND seq = 10",
        ["hmac-sha256:" + "0" * 64, scenario["run_id"]],
    )
    assert_both(scenario, tmp_path, "BROKEN", ("checkpoint_mismatch", 10, 10), 5)


def test_truncation_after_dispatch_is_a_gap_and_the_effect_stays_unknown(scenario, tmp_path, api_for, acme):
    run_id, op2 = scenario["run_id"], scenario["op2"]
    sql("DELETE FROM ledger_event WHERE run_id = %s AND seq > 9", [run_id])  # 9 = op2 DISPATCHED
    assert_both(scenario, tmp_path, "BROKEN", ("gap", 10, 17), 5)
    assert Operation.objects.get(pk=op2).phase == "UNKNOWN"
    assert ReconciliationCase.objects.get(operation_id=op2).status == "OPEN"
    indicators = api_for(acme).get(f"/runs/{run_id}").body["indicators"]
    assert indicators["completeness"]["value"] == "INCOMPLETE"
    assert indicators["integrity"]["value"] == "BROKEN"
    assert (indicators["integrity"]["first_bad_seq"], indicators["integrity"]["last_bad_seq"]) == (10, 17)
    assert indicators["certainty"]["value"] == "UNCERTAIN"


def test_key_rotation_old_checkpoints_verify_and_new_ones_use_the_new_key(api_for, acme, keys, tmp_path):
    client = api_for(acme)
    run_id = client.create_run()
    client.acquire(run_id, "worker-a")
    for n in range(8):
        client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"n": n}})
    assert verify_in_app(run_id)[0] == "UNSEALED"
    run_verify(run_id=run_id)  # seals 5 and 10 with k1
    keys.FENCELINE = {**keys.FENCELINE, "CHECKPOINT_KEYS": {"k1": K1, "k2": K2}, "CHECKPOINT_SIGNING_KEY_ID": "k2"}
    for n in range(5):
        client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"n": n}})
    run_verify(run_id=run_id)  # seals 15 with k2
    assert list(Checkpoint.objects.filter(run_id=run_id).values_list("seq", "key_id")) == [
        (5, "k1"),
        (10, "k1"),
        (15, "k2"),
    ]
    assert verify_in_app(run_id) == ("VERIFIED", None, 15)
    assert verify_standalone(client, run_id, tmp_path, {"k1": K1, "k2": K2}) == ("VERIFIED", None, 15)
    # Without the old key the old checkpoints cannot be trusted.
    assert verify_standalone(client, run_id, tmp_path, {"k2": K2})[:2] == ("BROKEN", ("checkpoint_mismatch", 5, 5))


def test_forged_dispatch_under_a_token_that_never_held_the_lease_is_an_authorization_mismatch(
    api_for, acme, keys, tmp_path
):
    client = api_for(acme)
    run_id = client.create_run()
    client.acquire(run_id, "worker-a")
    op = client.intend(run_id, 1, "charge:9").body["operation_id"]
    client.authorize(op, 1)
    head = Event.objects.filter(run_id=run_id).order_by("-seq").first()
    fields = {"operation_id": op, "from": "AUTHORIZED", "to": "DISPATCHED", "attempt": 1, "dispatch_token": 7}
    _forge(
        run_id,
        head.seq + 1,
        event_id="00000000-0000-4000-8000-0000000000aa",
        type="OPERATION_DISPATCHED",
        fields=fields,
        prev_hash=head.hash,
    )

    status, finding, _ = verify_in_app(run_id)
    assert (status, finding) == ("UNSEALED", None)  # hashed and linked like the real thing...
    authorization = client.get(f"/runs/{run_id}").body["indicators"]["authorization"]
    assert authorization["value"] == "MISMATCH"  # ...but no lease ever issued token 7
    assert authorization["reason"] == f"seq {head.seq + 1}: dispatched under token 7 while the chain shows token 1"


def test_forged_dispatch_with_a_rotated_credential_version_is_an_authorization_mismatch(api_for, acme, keys):
    from ledger.services.authority.credentials import credential_create, credential_rotate
    from ledger.services.authority.policy import policy_change

    policy_change(tenant=acme.tenant, document={"require_credential": True}, changed_by="admin", reason="leases")
    credential_create(tenant=acme.tenant, principal="github-bot", secret_ref="vault:kv/github-bot")
    client = api_for(acme)
    run_id = client.create_run()
    client.acquire(run_id, "worker-a")
    lease = client.post(
        f"/runs/{run_id}/credential-leases",
        {"fencing_token": 1, "principal": "github-bot", "actions": ["push"], "resources": ["repo:a"], "ttl_s": 600},
    ).body
    op = client.intend(run_id, 1, "push:1", tool="git", action="push", resource="repo:a").body["operation_id"]
    assert (
        client.post(
            f"/operations/{op}/authorize", {"fencing_token": 1, "credential_lease_id": lease["lease_id"]}
        ).status
        == 200
    )
    credential_rotate(tenant=acme.tenant, principal="github-bot", rotated_by="admin", reason="scheduled")
    assert client.dispatch(op, 1).body["error"] == "DENY_STALE_VERSION"  # the service refuses...

    # ...so an attacker writes the dispatch into the chain directly, hashed and linked.
    head = Event.objects.filter(run_id=run_id).order_by("-seq").first()
    fields = {
        "operation_id": op,
        "from": "AUTHORIZED",
        "to": "DISPATCHED",
        "attempt": 1,
        "dispatch_token": 1,
        "credential_version": 1,
    }
    sql("DELETE FROM ledger_event WHERE run_id = %s AND seq = %s", [run_id, head.seq])  # drop the DENIED event
    Run.objects.filter(pk=run_id).update(last_seq=head.seq - 1, last_hash=head.prev_hash)
    _forge(
        run_id,
        head.seq,
        event_id="00000000-0000-4000-8000-0000000000bb",
        type="OPERATION_DISPATCHED",
        fields=fields,
        prev_hash=head.prev_hash,
    )

    assert verify_in_app(run_id)[:2] == ("UNSEALED", None)
    authorization = client.get(f"/runs/{run_id}").body["indicators"]["authorization"]
    assert authorization["value"] == "MISMATCH"
    assert "after rotation to 2" in authorization["reason"]
