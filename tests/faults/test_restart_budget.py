"""The restart-loop article's failure matrix over HTTP (issue 13, items 3 and 4): a bad
config boots NOT_READY with its config hash and takes no claims; a state migration error
is QUARANTINED; an expired credential is CREDENTIALS_NOT_READY; an unknown outcome left by
the crashed process boots READY with admission paused until it is reconciled; a ready boot
admits again; consecutive crashes form an episode whose boots are answered min(300, 2^n) s,
and the restart past the budget quarantines the worker with its boots as the diagnostic
bundle. A policy with runtime_audit refuses admission to a boot whose self-audit fails it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ReconciliationCase
from approvals.services.cases import case_resolve
from fenceline_client import client as fl
from ledger.models import AdminAction, Operation, RunLease, Worker, WorkerBoot
from ledger.policy import RUNTIME_AUDIT_RULES
from ledger.services.authority.policy import policy_change
from ledger.services.fence.leases import leases_reap
from ledger.services.fleet.lifecycle import workers_drain_enforce
from tests.factories import READY


def readiness(**failed: dict) -> dict:
    return {**READY, **{domain: {"ok": False, "evidence": evidence} for domain, evidence in failed.items()}}


def test_a_bad_config_boots_not_ready_and_takes_no_claims(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    answer = worker.boot(
        config_hash="cfg-bad-7",
        code_version="v2.1",
        readiness=readiness(runtime={"check": "config", "missing": "PROVIDER_URL"}),
    )
    assert (answer["phase"], answer["failed_domains"], answer["delay_s"]) == ("PROCESS_UP", ["runtime"], 0)
    assert WorkerBoot.objects.get(worker=acme.worker).config_hash == "cfg-bad-7"
    run_id = worker.create_run()
    with pytest.raises(fl.NotReady) as refused:
        worker.lease(run_id).__enter__()
    assert type(refused.value) is fl.NotReady and refused.value.body["error"] == "NOT_READY"
    assert worker.get(f"/runs/{run_id}")["lease"]["fencing_token"] == 0  # no claim was made


def test_an_expired_credential_is_credentials_not_ready_and_a_ready_boot_admits_again(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    worker.boot(config_hash="cfg-1", code_version="v2", readiness=readiness(credentials={"expired": True}))
    run_id = worker.create_run()
    with pytest.raises(fl.CredentialsNotReady):
        worker.lease(run_id).__enter__()
    # A clean exit, then a ready boot: admitted, and the first lease makes it EXECUTING.
    worker.post("/workers/me/drain", {"deadline_s": 5})
    worker.exit()
    assert Worker.objects.get(pk=acme.worker.pk).status == "STOPPED"
    answer = worker.boot(config_hash="cfg-1", code_version="v2", readiness=READY)
    assert (answer["phase"], answer["delay_s"], answer["episode_boot"]) == ("READY", 0, 1)  # a new episode
    assert answer["worker_status"] == "ACCEPTING"  # a new process after a clean stop
    with worker.lease(run_id) as lease:
        assert lease.token == 1
    assert WorkerBoot.objects.filter(worker=acme.worker).latest("reported_at").phase == "EXECUTING"


def test_a_boot_after_a_drain_that_quiesced_stops_the_old_process_and_accepts(live_server, acme):
    # The drained process died before reporting its exit (or its exit raced the drain job):
    # the new process's boot is proof the old one is gone.
    worker = fl.Client(live_server.url, acme.token)
    worker.boot(config_hash="cfg-1", code_version="v2", readiness=READY)
    worker.drain(deadline_s=5)
    assert workers_drain_enforce() == 1  # no lease held: the drain job quiesces it
    answer = worker.boot(config_hash="cfg-1", code_version="v2", readiness=READY)
    assert (answer["worker_status"], answer["episode_boot"], answer["delay_s"]) == ("ACCEPTING", 1, 0)
    drain = acme.worker.drains.get()
    assert drain.stopped_at is not None
    with worker.lease(worker.create_run()) as lease:
        assert lease.token == 1


def test_an_exit_after_the_drain_job_quiesced_the_worker_is_accepted(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    worker.drain(deadline_s=5)
    assert workers_drain_enforce() == 1  # no lease held: QUIESCED before the exit arrives
    assert worker.exit()["status"] == "STOPPED"


def test_a_boot_report_sent_again_is_answered_as_before_and_another_under_its_id_is_refused(live_server, acme):
    # The answer to a boot was lost and the client sends the same report again.
    worker = fl.Client(live_server.url, acme.token)
    body = {
        "boot_id": "b-1",
        "config_hash": "cfg-1",
        "code_version": "v1",
        "state_schema_version": 1,
        "pid": 41,
        "host": "h",
        "readiness": READY,
    }
    first = worker.call("POST", "/workers/me/boots", body)
    again = worker.call("POST", "/workers/me/boots", body)
    assert (first[0], again[0]) == (201, 200) and first[1] == again[1]
    assert WorkerBoot.objects.filter(worker=acme.worker).count() == 1
    with pytest.raises(fl.BootIdReused) as reused:
        worker.call("POST", "/workers/me/boots", {**body, "pid": 42})
    assert reused.value.status == 409
    assert WorkerBoot.objects.filter(worker=acme.worker).count() == 1


def test_the_restart_past_the_budget_quarantines_with_a_diagnostic_bundle(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    answers = [
        worker.boot(config_hash=f"cfg-{n}", code_version="v3", readiness=READY, honour_delay=False) for n in range(7)
    ]
    # Each boot follows a crash (no exit between them): one episode, the delays doubling.
    assert [a["delay_s"] for a in answers] == [0, 2, 4, 8, 16, 32, 64]
    assert [a["quarantined"] for a in answers] == [False] * 6 + [True]
    assert Worker.objects.get(pk=acme.worker.pk).status == "QUARANTINED"
    record = AdminAction.objects.get(tenant=acme.tenant, action="worker.quarantine")
    assert record.actor == "system:restart-budget" and "6 restarts within 600 s" in record.reason
    bundle = record.fields["diagnostic_bundle"]
    assert [b["config_hash"] for b in bundle["boots"]][:2] == ["cfg-6", "cfg-5"]
    assert all(b["ended"] == "crash" for b in bundle["boots"][1:])


def test_a_boot_report_with_a_secret_in_its_evidence_is_refused_and_stores_nothing(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    canary = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    with pytest.raises(fl.ForbiddenField) as refused:
        worker.boot(config_hash="cfg-1", code_version="v1", readiness=readiness(credentials={"token": canary}))
    assert "readiness.credentials.evidence" in str(refused.value.body) and canary not in str(refused.value.body)
    assert not WorkerBoot.objects.exists()


def test_a_state_migration_error_quarantines_at_once_with_its_error_in_the_bundle(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    failed_at = timezone.now().isoformat()
    answer = worker.boot(
        config_hash="cfg-9",
        code_version="v4",
        state_schema_version=2,
        readiness=readiness(state={"migration": "1->2", "recovery_position": "step 3 of 5"}),
        error={"kind": "migration", "message": "column runs.plan missing after step 3", "at": failed_at},
    )
    assert (answer["quarantined"], answer["worker_status"], answer["delay_s"]) == (True, "QUARANTINED", 0)
    record = AdminAction.objects.get(tenant=acme.tenant, action="worker.quarantine")
    assert record.actor == "system:state-migration" and "column runs.plan missing" in record.reason
    (boot,) = record.fields["diagnostic_bundle"]["boots"]
    assert boot["error"]["kind"] == "migration" and boot["state_schema_version"] == 2
    assert boot["readiness"]["state"]["evidence"]["recovery_position"] == "step 3 of 5"
    with pytest.raises(fl.WorkerNotAccepting):  # no admission until a person decides
        worker.lease(worker.create_run()).__enter__()


def test_a_migration_error_with_its_state_ready_is_refused_and_stores_nothing(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    error = {"kind": "migration", "message": "half applied", "at": timezone.now().isoformat()}
    with pytest.raises(fl.InvalidRequest) as refused:
        worker.boot(config_hash="cfg-1", code_version="v1", readiness=READY, error=error)
    assert refused.value.body["fields"][0]["field"] == "error.kind"
    assert not WorkerBoot.objects.exists() and Worker.objects.get(pk=acme.worker.pk).status == "ACCEPTING"


def test_an_unknown_outcome_after_a_restart_boots_ready_with_admission_paused_until_reconciled(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    worker.boot(config_hash="cfg-1", code_version="v1", readiness=READY)
    run_id = worker.create_run()
    lease = worker.lease(run_id, ttl_s=30).__enter__()
    created = lease.post(
        f"/runs/{run_id}/operations",
        {
            "tool": "payments",
            "action": "charge",
            "resource": "c:1",
            "effect_class": "NON_RETRYABLE",
            "idempotency_key": "charge-1",
        },
    )
    op = created["operation_id"]
    lease.post(f"/operations/{op}/authorize")
    lease.post(f"/operations/{op}/dispatch")
    lease._stop.set()  # the process dies here: no outcome, no release, no exit

    answer = worker.boot(config_hash="cfg-1", code_version="v1", readiness=READY, honour_delay=False)
    assert (answer["phase"], answer["not_ready_code"], answer["unknown_left"]) == ("READY", "RECONCILE_FIRST", 1)
    other = worker.create_run()
    with pytest.raises(fl.ReconcileFirst) as paused:
        worker.lease(other).__enter__()
    assert "1 effect(s)" in paused.value.detail
    # The old lease expires; the reaper makes the effect UNKNOWN and opens a case ...
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    leases_reap()
    assert Operation.objects.get(pk=op).phase == "UNKNOWN"
    with pytest.raises(fl.ReconcileFirst):
        worker.lease(other).__enter__()
    # ... and once it is decided, the next acquire lifts the pause.
    case = ReconciliationCase.objects.get(operation_id=op)
    case_resolve(
        case_id=case.pk,
        resolution="HAPPENED",
        reason="the provider shows the charge",
        resolved_by="ops@example.com",
        provider_request_id="ch_1",
    )
    with worker.lease(other) as resumed:
        assert resumed.token == 1
    assert Worker.objects.get(pk=acme.worker.pk).not_ready_code == ""


@pytest.fixture
def strict_audit(acme):
    policy_change(
        tenant=acme.tenant,
        document={"runtime_audit": RUNTIME_AUDIT_RULES},
        reason="containers must be locked down",
        changed_by="admin@example.com",
    )


CLEAN_AUDIT = {
    "uid": 10001,
    "capabilities": [],
    "no_new_privileges": True,
    "read_only_root": True,
    "writable_mounts": ["/workspace"],
    "sensitive_mounts": [],
    "host_control": [],
}


def test_the_policy_refuses_admission_to_a_boot_whose_self_audit_fails(live_server, acme, strict_audit):
    worker = fl.Client(live_server.url, acme.token)
    audit = {
        **CLEAN_AUDIT,
        "uid": 0,
        "capabilities": ["sys_admin", "net_admin"],
        "host_control": ["/var/run/docker.sock"],
        "sensitive_mounts": ["/home/dev -> /workspace"],
    }
    answer = worker.boot(
        config_hash="cfg-1", code_version="v1", readiness={**READY, "runtime": fl.runtime_readiness(audit)}
    )
    assert (answer["phase"], answer["failed_domains"], answer["not_ready_code"]) == (
        "PROCESS_UP",
        ["admission"],
        "NOT_READY",
    )
    refused = WorkerBoot.objects.get(worker=acme.worker).readiness["admission"]["evidence"]["refused_by_policy"]
    assert refused == [
        "runs as root (uid 0)",
        "keeps capabilities: net_admin, sys_admin",
        "host-control paths reachable: /var/run/docker.sock",
        "sensitive or broad mounts: /home/dev -> /workspace",
    ]
    with pytest.raises(fl.NotReady):
        worker.lease(worker.create_run()).__enter__()


def test_a_boot_without_a_self_audit_fails_closed_and_a_clean_one_is_admitted(live_server, acme, strict_audit):
    worker = fl.Client(live_server.url, acme.token)
    answer = worker.boot(config_hash="cfg-1", code_version="v1", readiness=READY)
    assert answer["failed_domains"] == ["admission"]
    worker.post("/workers/me/drain", {"deadline_s": 5})
    worker.exit()
    answer = worker.boot(
        config_hash="cfg-2", code_version="v1", readiness={**READY, "runtime": fl.runtime_readiness(CLEAN_AUDIT)}
    )
    assert (answer["phase"], answer["not_ready_code"]) == ("READY", "")
    with worker.lease(worker.create_run()) as lease:
        assert lease.token == 1


def test_this_process_self_audit_travels_through_the_secret_boundary(live_server, acme):
    worker = fl.Client(live_server.url, acme.token)
    answer = worker.boot(config_hash="cfg-1", code_version="v1", readiness={**READY, "runtime": fl.runtime_readiness()})
    assert answer["phase"] == "READY"  # the starter policy sets no runtime_audit
    stored = WorkerBoot.objects.get(worker=acme.worker).readiness["runtime"]["evidence"]["audit"]
    assert set(stored) == {
        "uid",
        "capabilities",
        "no_new_privileges",
        "read_only_root",
        "writable_mounts",
        "sensitive_mounts",
        "host_control",
    }
