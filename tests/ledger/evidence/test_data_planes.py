"""The data planes (docs/architecture.md, "Data planes"): a diagnostic payload is kept beside the
chain, which commits to its digest (event schema version 2); retention removes the payloads
past their tenant's retention for their class, and every chain still verifies — the server's
verifier and the standalone one on an export both say "payload removed by retention", while a
payload whose bytes changed, or whose row is gone, is a finding. Chains written before any of
this verify byte for byte. User content is refused unless the tenant opted in, then kept
encrypted; viewers read no diagnostic payload. Real PostgreSQL, the worker API over HTTP,
the console through Django's client, the standalone verifier as a subprocess."""

import base64
import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from fenceline_client import evidence_verifier as ev
from ledger.errors import Forbidden, InvalidInput
from ledger.models import AdminAction, Checkpoint, DiagnosticPayload, Event, ProgressCheckpoint, Run, WorkerBoot
from ledger.services.evidence.export import chain_export
from ledger.services.evidence.planes import RETENTION_CLASSES
from ledger.services.evidence.retention import retention_apply
from ledger.services.evidence.verification import run_verify
from ledger.services.fence.notes import event_append
from ledger.services.fleet.boots import quarantine_with_bundle
from ledger.services.lifespan.checkpoints import checkpoint_save
from ledger.services.tenancy.tenants import tenant_planes_set
from tests.factories import READY, booted, leased_run, make_worker
from tests.helpers import logged_in, run_concurrently, tables_containing

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "chain_v1_golden.json"
STANDALONE = (
    Path(__file__).resolve().parents[3] / "clients" / "python" / "src" / "fenceline_client" / "evidence_verifier.py"
)
# The keys the golden chain (tests/unit/reference_chain.py, written at 46bffb0) was signed with.
GOLDEN_KEYS = {"k1": b"k1-secret-key-of-32-bytes-000000", "k2": b"k2-secret-key-of-32-bytes-111111"}
GOLDEN_EVENT_KEYS = {"e1": b"e1-event-key-of-32-bytes-0000000", "e2": b"e2-event-key-of-32-bytes-2222222"}
CANARY = "diagnostic-canary-7f3a"


@pytest.fixture
def keys(settings):
    settings.FENCELINE = {
        **settings.FENCELINE,
        "CHECKPOINT_KEYS": GOLDEN_KEYS,
        "CHECKPOINT_SIGNING_KEY_ID": "k1",
        "EVENT_KEYS": GOLDEN_EVENT_KEYS,
        "EVENT_SIGNING_KEY_ID": "e1",
    }
    return settings


def standalone(tmp_path, document, *, json_report=True):
    """fenceline-verify's file, run as a script on a clean interpreter (-I) over ``document``."""
    export = tmp_path / "export.json"
    export.write_text(document if isinstance(document, str) else json.dumps(document), encoding="utf-8")
    keys, event_keys = tmp_path / "keys.json", tmp_path / "event-keys.json"
    for path, given in ((keys, GOLDEN_KEYS), (event_keys, GOLDEN_EVENT_KEYS)):
        path.write_text(json.dumps({k: "base64:" + base64.b64encode(v).decode() for k, v in given.items()}))
    args = [sys.executable, "-I", str(STANDALONE), str(export), "--keys", str(keys), "--event-keys", str(event_keys)]
    done = subprocess.run([*args, *(["--json"] if json_report else [])], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1, 2), done.stderr
    return json.loads(done.stdout) if json_report else done.stdout


def exported(run, *, payloads=True) -> str:
    return "".join(chain_export(Run.objects.get(pk=run.pk), payloads=payloads))


def noted(identity, run, token, payload, *, klass="event_payload", fields=None):
    return event_append(
        worker=identity.worker,
        run_id=run.pk,
        fencing_token=token,
        type="x.step",
        fields=fields or {"step": "fetch"},
        payload=payload,
        payload_class=klass,
    )


def planes(tenant, days, user_content=None):
    """The tenant's planes set by a person (``tenant``, the instance the test holds, refreshed)."""
    tenant_planes_set(tenant=tenant.slug, days=days, user_content=user_content, reason="test", name="ada")
    tenant.refresh_from_db()


def aged(run, seq, days):
    """The payload at ``seq`` as if written ``days`` ago."""
    DiagnosticPayload.objects.filter(run=run, seq=seq).update(created_at=timezone.now() - timedelta(days=days))


# --- chains from before the planes -----------------------------------------------------------


def test_a_chain_written_before_the_planes_verifies_byte_for_byte(acme, keys, tmp_path):
    """The golden chain (written with the code before this change) stored as rows: the
    in-app verifier accepts it, the export gives back every event byte for byte, and the
    standalone verifier says VERIFIED with the golden head hash."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    head = golden["head"]
    run = Run.objects.create(
        id=golden["run_id"], tenant=acme.tenant, last_seq=head["last_seq"], last_hash=head["last_hash"]
    )
    Event.objects.bulk_create(
        Event(
            run=run,
            **{name: e[name] for name in ev.ROW_COLUMNS if name != "occurred_at"},
            occurred_at=datetime.fromisoformat(e["occurred_at"]),
        )
        for e in golden["events"]
    )
    Checkpoint.objects.bulk_create(
        Checkpoint(run=run, **{k: v for k, v in cp.items() if k != "run_id"}) for cp in golden["checkpoints"]
    )

    report = run_verify(run_id=run.pk, seal=False)
    assert (report.status, report.head_hash, report.finding) == ("VERIFIED", head["last_hash"], None)
    assert report.payloads_checked == report.payloads_removed == 0

    document = exported(run)
    events = json.loads(document)["events"]
    # The same documents (no key added to a version-1 event), hashing to the same bytes.
    assert events == golden["events"]
    assert [ev.canonical_json(e) for e in events] == [ev.canonical_json(e) for e in golden["events"]]
    cli = standalone(tmp_path, document)
    assert (cli["status"], cli["head_hash"], cli["finding"]) == ("VERIFIED", head["last_hash"], None)
    assert (
        standalone(tmp_path, golden)["head_hash"]
        == "sha256:0ac3e4e6119e1b4c4585fb930fb25afb0a458457b4a6953f750bea7145c3f70d"
    )


def test_events_without_a_payload_stay_version_1(acme, keys):
    run, token = leased_run(acme.worker)
    event = event_append(
        worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"payload_digest": 1}
    )
    assert event.schema_version == 1 and event.fields == {"payload_digest": 1}
    assert set(Event.objects.filter(run=run).values_list("schema_version", flat=True)) == {1}
    assert not DiagnosticPayload.objects.exists()


# --- the diagnostic plane over the worker API -----------------------------------------------


def test_a_payload_is_kept_beside_the_chain_which_commits_to_its_digest(api_for, acme, keys, tmp_path):
    client = api_for(acme)
    run_id = client.leased_run()
    payload = {"stderr": f"{CANARY} traceback line", "attempt": 2, "nested": {"ok": False, "ratio": 0.5}}
    r = client.post(
        f"/runs/{run_id}/events", {"fencing_token": 1, "type": "x.probe", "fields": {"k": 1}, "payload": payload}
    )
    assert r.status == 201, r
    event = Event.objects.get(run_id=run_id, seq=r.body["seq"])
    digest = ev.payload_digest(payload)
    assert event.schema_version == ev.PAYLOAD_VERSION
    assert event.fields == {"k": 1, "payload_digest": digest, "payload_class": "event_payload"}
    assert tables_containing(CANARY) == ["ledger_diagnosticpayload"]  # not in the chain

    export = client.get(f"/runs/{run_id}/events")
    assert export.status == 200
    exported_event = export.body["events"][-1]
    assert exported_event["payload"] == payload
    report = standalone(tmp_path, export.body)
    assert report["finding"] is None and report["payloads_checked"] == 1
    assert run_verify(run_id=run_id).finding is None


def test_the_worker_client_sends_a_payload(live_server, acme, keys):
    import fenceline_client as fl

    worker = fl.Client(live_server.url, acme.token)
    run_id = worker.create_run()
    with worker.lease(run_id) as lease:
        appended = lease.event("x.fetch", {"step": 1}, payload={"response": {"status": 503, "body": "busy"}})
        lease.release()
    kept = DiagnosticPayload.objects.get(run_id=run_id, seq=appended["seq"])
    assert (kept.klass, kept.body) == ("event_payload", {"response": {"status": 503, "body": "busy"}})
    assert Event.objects.get(run_id=run_id, seq=appended["seq"]).fields["payload_digest"] == kept.digest


def test_the_payload_is_bounded_and_reserved_and_through_the_boundary(api_for, acme):
    client = api_for(acme)
    run_id = client.leased_run()

    def append(**body):
        return client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {}, **body})

    def field(r):
        assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), r
        return [problem["field"] for problem in r.body["fields"]]

    assert field(append(payload={"blob": "x" * (65 * 1024)})) == ["payload"]
    assert field(append(payload={"n": 1e16})) == ["payload.n"]  # not stored byte for byte
    assert field(append(payload={"a": 1}, fields={"payload_digest": "x"})) == ["fields.payload_digest"]
    refused = append(payload={"stdout": "ok", "nested": {"note": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"}})
    assert refused.status == 422 and refused.body["path"] == "payload.nested.note", refused
    refused = append(payload={"headers": {"authorization": "x"}})
    assert refused.status == 422 and refused.body["path"] == "payload.headers.authorization", refused
    assert append(payload={"a": 1}, payload_class="secrets").status == 422
    assert not DiagnosticPayload.objects.exists()


# --- retention ------------------------------------------------------------------------------


def test_retention_removes_only_payloads_past_their_tenants_retention_for_their_class(acme, keys):
    globex = make_worker("globex", "g-1")
    planes(acme.tenant, {"event_payload": 7}, user_content=True)
    run_a, token_a = leased_run(acme.worker)
    run_g, token_g = leased_run(globex.worker)
    old_a = noted(acme, run_a, token_a, {"n": "old acme"}).seq
    young_a = noted(acme, run_a, token_a, {"n": "young acme"}).seq
    content_a = noted(acme, run_a, token_a, {"n": "acme's user content"}, klass="user_content").seq
    old_g = noted(globex, run_g, token_g, {"n": "old globex"}).seq
    for run, seq, days in ((run_a, old_a, 10), (run_a, young_a, 6), (run_a, content_a, 10), (run_g, old_g, 10)):
        aged(run, seq, days)

    dry = retention_apply(dry_run=True)
    assert [(d.tenant, d.klass, d.count) for d in dry.due] == [("acme", "event_payload", 1)]
    assert dry.removed == 0 and DiagnosticPayload.objects.filter(removed_at__isnull=False).count() == 0

    assert retention_apply(batch=1).removed == 1
    removed = {(p.run_id, p.seq) for p in DiagnosticPayload.objects.filter(removed_at__isnull=False)}
    assert removed == {(run_a.pk, old_a)}
    kept = DiagnosticPayload.objects.get(run=run_a, seq=old_a)
    assert kept.body is None and kept.digest.startswith("sha256:")  # the row stays as the marker
    assert retention_apply().removed == 0  # idempotent

    # globex's default (30 days) and acme's user content (30 days) come due later.
    planes(globex.tenant, {"event_payload": 9})
    assert retention_apply().removed == 1
    assert DiagnosticPayload.objects.get(run=run_g, seq=old_g).body is None
    assert DiagnosticPayload.objects.get(run=run_a, seq=content_a).body is not None


def test_the_command_shows_what_is_due_and_the_beat_job_removes_it(acme, keys, settings):
    run, token = leased_run(acme.worker)
    for n in range(3):
        aged(run, noted(acme, run, token, {"n": n}).seq, 40)
    out = __import__("io").StringIO()
    call_command("retention", "--dry-run", stdout=out)
    assert "acme event_payload: 3 due" in out.getvalue() and "none removed" in out.getvalue()
    assert DiagnosticPayload.objects.filter(removed_at__isnull=True).count() == 3

    assert "apply-retention" in settings.CELERY_BEAT_SCHEDULE
    from celery import current_app

    task = current_app.tasks[settings.CELERY_BEAT_SCHEDULE["apply-retention"]["task"]]
    assert task.apply().get() == {"removed": 3, "flow_places": 0, "flow_shards": 0}  # no idle flow key here
    out = __import__("io").StringIO()
    call_command("retention", stdout=out)
    assert "removed 0 items by retention" in out.getvalue()


def test_after_retention_every_chain_verifies_and_says_payload_removed_by_retention(acme, keys, tmp_path):
    run, token = leased_run(acme.worker)
    gone = noted(acme, run, token, {"trace": "old"}).seq
    kept = noted(acme, run, token, {"trace": "new"}).seq
    aged(run, gone, 31)
    assert retention_apply().removed == 1

    report = run_verify(run_id=run.pk)
    assert report.finding is None and report.status in ("VERIFIED", "UNSEALED")
    assert (report.payloads_checked, report.payloads_removed, report.payloads_removed_seqs) == (1, 1, [gone])

    out = __import__("io").StringIO()
    call_command("verify_ledger", "--run", str(run.pk), stdout=out)
    assert f"1 payload removed by retention (seq {gone})" in out.getvalue()

    document = json.loads(exported(run))
    by_seq = {e["seq"]: e for e in document["events"]}
    assert by_seq[gone]["payload_removed"]["by"] == "retention" and "payload" not in by_seq[gone]
    assert by_seq[kept]["payload"] == {"trace": "new"}
    cli = standalone(tmp_path, document)
    assert cli["finding"] is None and (cli["payloads_removed"], cli["payloads_removed_seqs"]) == (1, [gone])
    text = standalone(tmp_path, document, json_report=False)
    assert f"payload removed by retention: seq {gone}" in text


def test_a_changed_or_deleted_payload_is_tampering_not_retention(acme, keys, tmp_path):
    run, token = leased_run(acme.worker)
    first = noted(acme, run, token, {"trace": "as written"}).seq
    second = noted(acme, run, token, {"trace": "second"}).seq
    removed = noted(acme, run, token, {"trace": "old"}).seq
    aged(run, removed, 31)
    retention_apply()

    DiagnosticPayload.objects.filter(run=run, seq=first).update(body={"trace": "rewritten"})
    report = run_verify(run_id=run.pk)
    assert report.status == "BROKEN"
    assert (report.finding.reason, report.finding.first_seq) == ("payload_mismatch", first)
    cli = standalone(tmp_path, exported(run))
    assert (cli["status"], cli["finding"]["reason"], cli["finding"]["first_seq"]) == (
        "BROKEN",
        "payload_mismatch",
        first,
    )

    DiagnosticPayload.objects.filter(run=run, seq=first).update(body={"trace": "as written"})
    assert run_verify(run_id=run.pk).finding is None
    DiagnosticPayload.objects.filter(run=run, seq=second).delete()  # gone without retention's marker
    report = run_verify(run_id=run.pk)
    assert (report.finding.reason, report.finding.first_seq) == ("payload_missing", second)
    cli = standalone(tmp_path, exported(run))
    assert (cli["finding"]["reason"], cli["finding"]["first_seq"]) == ("payload_missing", second)

    # Passing someone else's payload off as removed by retention in an export is caught too:
    # the export's marker must say retention.
    document = json.loads(exported(run))
    for event in document["events"]:
        if event["seq"] == removed:
            event["payload_removed"] = {"by": "someone"}
        if event["seq"] == second:
            event["payload"] = {"trace": "second"}
    assert standalone(tmp_path, document)["finding"]["reason"] == "payload_missing"


@pytest.mark.django_db(transaction=True)
def test_retention_concurrent_with_appends_loses_nothing(keys):
    """Four threads append events with payloads to their runs while a fifth removes, one
    payload per transaction, the payloads written "40 days ago" before they started: every
    new payload is kept whole, every old one removed, every chain verifies."""
    acme = make_worker("acme", "worker-c")
    runs = [leased_run(acme.worker, owner=f"owner-{i}") for i in range(4)]
    old = []
    for run, token in runs:
        for n in range(15):
            seq = noted(acme, run, token, {"old": n}).seq
            aged(run, seq, 40)
            old.append((run.pk, seq))
    appends = 25

    def work(i):
        if i == 4:
            total = 0
            for _ in range(20):
                total += retention_apply(batch=1).removed
            return total
        run, token = runs[i]
        return [noted(acme, run, token, {"new": n, "thread": i}).seq for n in range(appends)]

    results = run_concurrently(work, 5, timeout=120)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert results[4] + retention_apply().removed == len(old)
    for i, (run, _) in enumerate(runs):
        new = DiagnosticPayload.objects.filter(run=run, seq__in=results[i])
        assert sorted(p.body["new"] for p in new if p.body is not None) == list(range(appends))
        assert run_verify(run_id=run.pk).finding is None
    gone = DiagnosticPayload.objects.filter(removed_at__isnull=False)
    assert {(p.run_id, p.seq) for p in gone} == set(old)
    with connection.cursor() as cursor:  # the chains were never touched by retention
        cursor.execute("SELECT count(*) FROM ledger_event WHERE schema_version = 2")
        assert cursor.fetchone()[0] == len(old) + 4 * appends


# --- user content and roles -----------------------------------------------------------------


def test_user_content_is_refused_unless_the_tenant_opted_in_then_kept_encrypted(
    api_for, acme, operator, keys, tmp_path
):
    client = api_for(acme)
    run_id = client.leased_run()
    body = {"fencing_token": 1, "type": "x.reply", "fields": {}, "payload": {"text": f"user wrote {CANARY}"}}
    refused = client.post(f"/runs/{run_id}/events", {**body, "payload_class": "user_content"})
    assert (refused.status, refused.body["error"]) == (403, "USER_CONTENT_REFUSED"), refused
    assert [p["field"] for p in refused.body["fields"]] == ["payload_class"], refused
    assert tables_containing(CANARY) == []

    planes(acme.tenant, {}, user_content=True)
    r = client.post(f"/runs/{run_id}/events", {**body, "payload_class": "user_content"})
    assert r.status == 201, r
    assert tables_containing(CANARY) == []  # encrypted at rest
    stored = DiagnosticPayload.objects.get(run_id=run_id, seq=r.body["seq"])
    assert stored.klass == "user_content" and stored.body["alg"] == "AES-256-GCM"
    page = logged_in(operator).get(f"/runs/{run_id}/events/{r.body['seq']}/payload")
    assert page.status_code == 200 and page.json()["payload"] == {"text": f"user wrote {CANARY}"}
    assert standalone(tmp_path, client.get(f"/runs/{run_id}/events").body)["finding"] is None


def test_user_content_sealed_under_a_key_the_server_no_longer_holds_answers_503_naming_it(
    api_for, acme, operator, keys, settings
):
    client = api_for(acme)
    run_id = client.leased_run()
    planes(acme.tenant, {}, user_content=True)
    body = {
        "fencing_token": 1,
        "type": "x.reply",
        "fields": {},
        "payload": {"text": "hello"},
        "payload_class": "user_content",
    }
    seq = client.post(f"/runs/{run_id}/events", body).body["seq"]
    sealed_under = DiagnosticPayload.objects.get(run_id=run_id, seq=seq).body["key_id"]

    settings.FENCELINE = {**settings.FENCELINE, "USER_CONTENT_KEYS": {"another": b"k" * 32}}
    page = logged_in(operator).get(f"/runs/{run_id}/events/{seq}/payload")
    assert page.status_code == 503 and page.json()["error"] == "KEY_UNAVAILABLE"
    assert repr(sealed_under) in page.json()["detail"]


def test_a_viewer_reads_no_diagnostic_payload(acme, viewer, operator, admin, keys, tmp_path):
    run, token = leased_run(acme.worker)
    seq = noted(acme, run, token, {"trace": CANARY}).seq

    seen = logged_in(viewer).get(f"/runs/{run.pk}/events/{seq}/payload")
    assert seen.status_code == 403 and CANARY not in seen.content.decode()
    export = logged_in(viewer).get(f"/runs/{run.pk}/chain.json")
    text = b"".join(export.streaming_content).decode()
    assert export.status_code == 200 and CANARY not in text
    report = standalone(tmp_path, text)
    assert report["finding"] is None and report["payloads_withheld"] == 1

    link = f'href="/runs/{run.pk}/events/{seq}/payload"'
    assert link not in logged_in(viewer).get(f"/runs/{run.pk}/").content.decode()
    assert link in logged_in(operator).get(f"/runs/{run.pk}/").content.decode()
    for user in (operator, admin):
        page = logged_in(user).get(f"/runs/{run.pk}/events/{seq}/payload")
        assert page.status_code == 200 and page.json()["payload"] == {"trace": CANARY}
        export = b"".join(logged_in(user).get(f"/runs/{run.pk}/chain.json").streaming_content).decode()
        assert CANARY in export
    assert logged_in(operator).get(f"/runs/{run.pk}/events/1/payload").status_code == 404


# --- the plane's other classes: checkpoint state, boot evidence, bundles ----------------------


def test_retention_empties_superseded_checkpoint_states_and_the_chain_keeps_their_digest(acme, keys):
    run, token = leased_run(acme.worker)
    old = checkpoint_save(worker=acme.worker, run_id=run.pk, fencing_token=token, position="p1", state={"n": CANARY})
    latest = checkpoint_save(worker=acme.worker, run_id=run.pk, fencing_token=token, position="p2", state={"n": 2})
    ProgressCheckpoint.objects.filter(pk__in=[old.pk, latest.pk]).update(created_at=timezone.now() - timedelta(days=31))
    assert retention_apply().removed == 1
    old.refresh_from_db()
    latest.refresh_from_db()
    assert (old.state, old.state_removed_at is not None, old.digest.startswith("sha256:")) == ({}, True, True)
    assert (latest.state, latest.state_removed_at) == ({"n": 2}, None)  # what the next owner resumes from
    assert tables_containing(CANARY) == []
    recorded = Event.objects.get(run=run, type="PROGRESS_CHECKPOINTED", fields__seq=old.seq)
    assert recorded.fields["digest"] == old.digest
    assert run_verify(run_id=run.pk).finding is None


def test_retention_empties_superseded_boots_evidence_and_a_viewer_never_sees_it(acme, viewer, operator, keys):
    failing = {**READY, "runtime": {"ok": False, "evidence": {"probe": f"{CANARY} probe"}}}
    at = timezone.now().isoformat()
    first = booted(acme.worker, readiness=failing, error={"kind": "crash", "message": f"{CANARY} crash", "at": at}).boot
    later = {**READY, "runtime": {"ok": False, "evidence": {"probe": "later probe"}}}
    second = booted(acme.worker, readiness=later, error={"kind": "crash", "message": "second crash", "at": at}).boot
    page = logged_in(viewer).get(f"/workers/{acme.worker.pk}/").content.decode()
    assert CANARY not in page and "second crash" not in page and "crash" in page
    assert f"{CANARY} crash" in logged_in(operator).get(f"/workers/{acme.worker.pk}/").content.decode()

    for boot, days in ((first, 32), (second, 31)):
        WorkerBoot.objects.filter(pk=boot.pk).update(reported_at=timezone.now() - timedelta(days=days))
    assert retention_apply().removed == 1
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.readiness["runtime"] == {"ok": False, "evidence": {}} and first.error.keys() == {"kind", "at"}
    assert first.evidence_removed_at is not None and second.evidence_removed_at is None
    assert second.error["message"] == "second crash"  # the worker's latest boot stays whole
    assert tables_containing(CANARY) == []


def test_retention_removes_a_quarantine_bundle_and_a_viewer_never_sees_it(acme, viewer, operator, keys):
    now = timezone.now()
    quarantine_with_bundle(
        acme.worker, actor="system:test", reason="restart budget", now=now, evidence={"note": CANARY}
    )
    action = AdminAction.objects.get(action="worker.quarantine")
    assert action.fields["diagnostic_bundle"]["note"] == CANARY
    assert "Diagnostic bundle" not in logged_in(viewer).get(f"/workers/{acme.worker.pk}/").content.decode()
    assert "Diagnostic bundle" in logged_in(operator).get(f"/workers/{acme.worker.pk}/").content.decode()

    AdminAction.objects.filter(pk=action.pk).update(occurred_at=now - timedelta(days=89))
    assert retention_apply(dry_run=True).due == []  # bundles are kept 90 days by default
    planes(acme.tenant, {"bundle": 60})
    assert retention_apply().removed == 1
    action.refresh_from_db()
    assert "diagnostic_bundle" not in action.fields and action.fields["diagnostic_bundle_removed_at"].endswith("Z")
    assert (action.reason, action.actor) == ("restart budget", "system:test")  # the decision stays
    assert tables_containing(CANARY) == []
    assert retention_apply().removed == 0


def test_retention_settings_are_a_persons_checked_decision(acme, viewer, settings):
    assert set(settings.FENCELINE["RETENTION_DAYS"]) == set(RETENTION_CLASSES)  # a default for every class
    for days in ({"secrets": 1}, {"bundle": -1}, {"bundle": "7"}, {"bundle": 36_501}):
        with pytest.raises(InvalidInput):
            planes(acme.tenant, days)
    with pytest.raises(Forbidden):
        tenant_planes_set(tenant="acme", days={"bundle": 1}, reason="x", user=viewer)
    out = __import__("io").StringIO()
    call_command(
        "retention",
        "--tenant",
        "acme",
        "--days",
        "bundle=7",
        "--user-content",
        "yes",
        "--by",
        "ada",
        "--reason",
        "GDPR",
        stdout=out,
    )
    assert "acme: retention {'bundle': 7}; accepts user content" in out.getvalue()
    decision = AdminAction.objects.get(action="tenant.planes")
    assert (decision.actor, decision.reason, decision.fields) == (
        "ada",
        "GDPR",
        {"retention_days": {"bundle": 7}, "user_content_opt_in": True},
    )
