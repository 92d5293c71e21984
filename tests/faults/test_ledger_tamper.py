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
from ledger.chain import canonical_bytes, event_mac, format_time, hash_bytes
from ledger.models import Checkpoint, Event, Operation, Run
from ledger.services.evidence.verification import run_verify
from tests.factories import expire
from tests.helpers import tampering

STANDALONE = (
    Path(__file__).resolve().parents[2] / "clients" / "python" / "src" / "fenceline_client" / "evidence_verifier.py"
)
K1 = b"k1-secret-for-tamper-tests-0001!"
K2 = b"k2-secret-for-tamper-tests-0002!"
E1 = b"e1-event-key-for-tamper-tests-01"
E2 = b"e2-event-key-for-tamper-tests-02"

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
        "EVENT_KEYS": {"e1": E1},
        "EVENT_SIGNING_KEY_ID": "e1",
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
    expire(run_id)
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


def _keys_file(path: Path, keys: dict[str, bytes]) -> str:
    path.write_text(json.dumps({k: "base64:" + base64.b64encode(v).decode() for k, v in keys.items()}))
    return str(path)


def verify_standalone(client, run_id, tmp_path, keys=None, event_keys=None):
    export = client.get(f"/runs/{run_id}/events")
    assert export.status == 200
    (tmp_path / "export.json").write_bytes(export.raw.content)
    _keys_file(tmp_path / "keys.json", keys or {"k1": K1})
    run = Run.objects.get(pk=run_id)
    args = [
        sys.executable,
        "-I",
        str(STANDALONE),
        str(tmp_path / "export.json"),
        "--keys",
        str(tmp_path / "keys.json"),
        "--event-keys",
        _keys_file(tmp_path / "event-keys.json", event_keys or {"e1": E1}),
        "--json",
    ]
    if run.trusted_seq:
        args += ["--trusted", f"{run.trusted_seq}:{run.trusted_hash}"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode in (0, 1, 2), done.stderr
    report = json.loads(done.stdout)
    assert report["event_macs"] == "checked"
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


def _forge(
    run_id: str,
    seq: int,
    *,
    event_id: str,
    type: str,
    fields: dict,
    prev_hash: str,
    mac_key: tuple[str, bytes] | None = None,
) -> str:
    """Insert an event hashed and linked exactly as Fenceline would, and move the run head
    to it: an attacker who knows the algorithm but not the checkpoint key. Without
    ``mac_key`` (key id, key) the attacker has no event key either and the event has no MAC;
    with it, the event is signed as Fenceline would sign it."""
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
    key_id, mac = "", ""
    if mac_key is not None:
        key_id, mac = mac_key[0], event_mac(mac_key[1], run_id=run_id, seq=seq, hash=digest, key_id=mac_key[0])
    sql(
        "INSERT INTO ledger_event (run_id, seq, event_id, type, actor, occurred_at, fields, prev_hash, hash, "
        "mac_key_id, mac, schema_version) VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, 1)",
        [
            run_id,
            seq,
            event_id,
            type,
            template.actor,
            template.occurred_at,
            json.dumps(fields),
            prev_hash,
            digest,
            key_id,
            mac,
        ],
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
        mac_key=("e1", E1),  # even with the event key: the phase table refuses it
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


def test_forged_event_appended_after_the_last_checkpoint_with_a_correct_hash_is_broken_at_its_seq_for_its_mac(
    scenario, tmp_path
):
    # The attack the hash chain alone misses: the head moved with it, no checkpoint after it.
    run_id = scenario["run_id"]
    head = Event.objects.get(run_id=run_id, seq=HEAD)
    _forge(
        run_id,
        HEAD + 1,
        event_id="00000000-0000-4000-8000-000000000118",
        type="NOTE",
        fields={"step": "all good"},
        prev_hash=head.hash,
    )
    assert_both(scenario, tmp_path, "BROKEN", ("mac_missing", 18, 18), 17)
    run = Run.objects.get(pk=run_id)
    assert (run.broken_reason, run.broken_first_seq) == ("mac_missing", 18)


def test_forged_event_with_a_mac_under_a_guessed_key_is_a_mac_mismatch(scenario, tmp_path):
    run_id = scenario["run_id"]
    head = Event.objects.get(run_id=run_id, seq=HEAD)
    _forge(
        run_id,
        HEAD + 1,
        event_id="00000000-0000-4000-8000-000000000218",
        type="NOTE",
        fields={"step": "all good"},
        prev_hash=head.hash,
        mac_key=("e1", b"not-the-event-key-but-its-id-0001"),
    )
    assert_both(scenario, tmp_path, "BROKEN", ("mac_mismatch", 18, 18), 17)


def _rewrite_from(run_id: str, seq: int, fields: dict) -> None:
    """Change event ``seq``'s fields and recompute its hash and every following hash and
    link, as an attacker with database access and no event key would; the run head follows."""
    prev = Event.objects.get(run_id=run_id, seq=seq - 1).hash
    for event in Event.objects.filter(run_id=run_id, seq__gte=seq).order_by("seq"):
        new_fields = fields if event.seq == seq else event.fields
        digest = hash_bytes(
            canonical_bytes(
                run_id=run_id,
                seq=event.seq,
                event_id=str(event.event_id),
                type=event.type,
                schema_version=event.schema_version,
                actor=event.actor,
                occurred_at=format_time(event.occurred_at),
                fields=new_fields,
                prev_hash=prev,
            )
        )
        sql(
            "UPDATE ledger_event SET fields = %s::jsonb, prev_hash = %s, hash = %s WHERE run_id = %s AND seq = %s",
            [json.dumps(new_fields), prev, digest, run_id, event.seq],
        )
        prev = digest
    Run.objects.filter(pk=run_id).update(last_hash=prev)


def test_rewritten_event_with_recomputed_hashes_is_a_mac_mismatch_at_its_seq(scenario, tmp_path):
    run_id = scenario["run_id"]
    # NOTE at 14 rewritten, 14..17 re-hashed and re-linked: without MACs only the checkpoint
    # at 15 would notice, as a range 11..15; the MAC names seq 14.
    _rewrite_from(run_id, 14, {"step": "nothing happened"})
    assert_both(scenario, tmp_path, "BROKEN", ("mac_mismatch", 14, 14), 10)
    run = Run.objects.get(pk=run_id)
    assert (run.broken_reason, run.broken_first_seq, run.broken_last_seq) == ("mac_mismatch", 14, 14)


def test_event_under_an_unknown_key_id_is_broken_at_its_seq(scenario, tmp_path):
    run_id = scenario["run_id"]
    event = Event.objects.get(run_id=run_id, seq=8)
    mac = event_mac(b"some-key-fenceline-never-had-0001", run_id=run_id, seq=8, hash=event.hash, key_id="e9")
    sql("UPDATE ledger_event SET mac_key_id = 'e9', mac = %s WHERE run_id = %s AND seq = 8", [mac, run_id])
    assert_both(scenario, tmp_path, "BROKEN", ("mac_unknown_key_id", 8, 8), 5)


def test_events_signed_under_an_old_key_still_verify_after_the_signing_key_changes(api_for, acme, keys, tmp_path):
    client = api_for(acme)
    run_id = client.create_run()
    client.acquire(run_id, "worker-a")
    for n in range(3):
        client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"n": n}})
    keys.FENCELINE = {**keys.FENCELINE, "EVENT_KEYS": {"e1": E1, "e2": E2}, "EVENT_SIGNING_KEY_ID": "e2"}
    for n in range(3):
        client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"n": n}})
    assert list(Event.objects.filter(run_id=run_id).order_by("seq").values_list("mac_key_id", flat=True)) == [
        *["e1"] * 5,
        *["e2"] * 3,
    ]
    run_verify(run_id=run_id)  # seals seq 5
    assert verify_in_app(run_id) == ("UNSEALED", None, 5)
    assert verify_standalone(client, run_id, tmp_path, event_keys={"e1": E1, "e2": E2}) == ("UNSEALED", None, 5)
    # The old key id dropped from the keyring too early: the old events can no longer be checked.
    assert verify_standalone(client, run_id, tmp_path, event_keys={"e2": E2})[:2] == (
        "BROKEN",
        ("mac_unknown_key_id", 1, 1),
    )


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
        mac_key=("e1", E1),  # an insider with the event key
    )

    status, finding, _ = verify_in_app(run_id)
    assert (status, finding) == ("UNSEALED", None)  # hashed, linked and signed like the real thing...
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
        mac_key=("e1", E1),
    )

    assert verify_in_app(run_id)[:2] == ("UNSEALED", None)
    authorization = client.get(f"/runs/{run_id}").body["indicators"]["authorization"]
    assert authorization["value"] == "MISMATCH"
    assert "after rotation to 2" in authorization["reason"]
