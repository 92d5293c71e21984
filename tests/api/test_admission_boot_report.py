"""Admission the worker cannot skip (issue 36, item 4), over HTTP against the live server: under
``admission.boot_report_required`` a worker that never sent a boot report is refused a lease
with 409 NOT_READY naming the missing report, and admitted once it reports a ready boot; the
starter policy (and a stored policy from before the key) admits it; each filesystem rule of
``runtime_audit`` refuses a boot whose self-audit shows the violation and admits a clean one;
and the Python client sends its boot report before its first lease."""

import pytest

from fenceline_client import client as fl
from ledger.models import Event, TenantPolicy, Worker, WorkerBoot
from ledger.policy import RUNTIME_AUDIT_RULES
from ledger.services.authority.policy import policy_change
from ledger.services.fleet.workers import worker_rotate_token
from tests.factories import READY


def require_boot_reports(tenant, **extra):
    policy_change(
        tenant=tenant,
        document={"admission": {"boot_report_required": True}, **extra},
        reason="no worker is admitted without a boot report",
        changed_by="admin@example.com",
    )


def boot_body(boot_id: str, audit: dict | None = None) -> dict:
    readiness = READY if audit is None else {**READY, "runtime": {"ok": True, "evidence": {"audit": audit}}}
    return {
        "boot_id": boot_id,
        "config_hash": "cfg-1",
        "code_version": "v1",
        "state_schema_version": 2,
        "pid": 4242,
        "host": "worker-host",
        "readiness": readiness,
    }


def test_a_worker_that_skips_its_boot_report_is_refused_naming_it(api_for, acme):
    require_boot_reports(acme.tenant)
    api = api_for(acme)
    run_id = api.create_run()  # creating a run is not a lease: allowed
    refused = api.acquire(run_id, "owner-1")
    assert refused.status == 409, refused
    assert refused.body["error"] == "NOT_READY"
    assert refused.body["missing"] == "boot_report"
    assert "boot report" in refused.body["detail"] and "admission.boot_report_required" in refused.body["detail"]
    assert not Event.objects.filter(run_id=run_id, type="LEASE_ACQUIRED").exists()

    booted = api.post("/workers/me/boots", boot_body("boot-1"))
    assert booted.status == 201, booted
    granted = api.acquire(run_id, "owner-1")
    assert granted.status == 200, granted
    assert granted.body["fencing_token"] == 1
    assert Worker.objects.get(pk=acme.worker.pk).boot_phase == "EXECUTING"


def test_a_rotated_token_needs_a_boot_report_of_its_own(api_for, acme):
    """The boot reported under the old token is not the new token's holder's: after a rotation
    the worker is refused until the process with the new token reports its boot."""
    require_boot_reports(acme.tenant)
    old = api_for(acme)
    assert old.post("/workers/me/boots", boot_body("boot-old")).status == 201
    run_id = old.create_run()
    assert old.acquire(run_id, "owner-1").status == 200
    new = api_for(token=worker_rotate_token(worker=Worker.objects.get(pk=acme.worker.pk)))
    refused = new.acquire(new.create_run(), "owner-2")
    assert (refused.status, refused.body["error"], refused.body["missing"]) == (409, "NOT_READY", "boot_report")
    assert new.post("/workers/me/boots", boot_body("boot-new")).status == 201
    assert new.acquire(new.create_run(), "owner-2").status == 200


def test_a_boot_report_that_is_not_ready_still_refuses_under_the_requiring_policy(api_for, acme):
    require_boot_reports(acme.tenant)
    api = api_for(acme)
    body = boot_body("boot-1")
    body["readiness"] = {**READY, "state": {"ok": False, "evidence": {"migration": "pending"}}}
    assert api.post("/workers/me/boots", body).status == 201
    refused = api.acquire(api.create_run(), "owner-1")
    assert (refused.status, refused.body["error"]) == (409, "NOT_READY")
    assert "missing" not in refused.body  # it has a report: the report's failed domain refuses


def test_the_starter_policy_admits_a_worker_that_never_booted(api_for, acme):
    api = api_for(acme)
    granted = api.acquire(api.create_run(), "owner-1")
    assert granted.status == 200, granted
    assert not WorkerBoot.objects.filter(worker=acme.worker).exists()


def test_a_policy_stored_before_the_key_existed_admits_an_unbooted_worker(api_for, acme):
    """An existing tenant's stored document has no ``admission`` key: it reads as the starter's."""
    policy_change(tenant=acme.tenant, document={"max_calls": 7}, reason="an older policy", changed_by="a@example.com")
    stored = TenantPolicy.objects.filter(tenant=acme.tenant).order_by("-version").first()
    document = {k: v for k, v in stored.document.items() if k != "admission"}
    TenantPolicy.objects.filter(pk=stored.pk).update(document=document)
    api = api_for(acme)
    granted = api.acquire(api.create_run(), "owner-1")
    assert granted.status == 200, granted


def test_turning_the_requirement_off_admits_the_unbooted_worker_again(api_for, acme):
    require_boot_reports(acme.tenant)
    api = api_for(acme)
    run_id = api.create_run()
    assert api.acquire(run_id, "owner-1").status == 409
    policy_change(
        tenant=acme.tenant,
        document={"admission": {"boot_report_required": False}},
        reason="back to admitting workers without a boot report",
        changed_by="admin@example.com",
    )
    assert api.acquire(run_id, "owner-1").status == 200


CLEAN = {
    "uid": 10001,
    "capabilities": [],
    "no_new_privileges": True,
    "read_only_root": True,
    "writable_mounts": ["/workspace", "/scratch", "/var/lib/agent/state"],
    "sensitive_mounts": [],
    "host_control": [],
}
FILESYSTEM_RULES = {
    **RUNTIME_AUDIT_RULES,
    "allow_writable_root": False,
    "allow_new_privileges": False,
    "output_paths": ["/workspace", "/scratch", "/var/lib/agent/"],
}


@pytest.mark.parametrize(
    "violation, refusal",
    [
        ({"read_only_root": False}, "root filesystem writable"),
        ({"read_only_root": None}, "root filesystem writable: (unreported)"),
        ({"no_new_privileges": False}, "no-new-privileges not set"),
        ({"no_new_privileges": "1"}, "no-new-privileges not set: (unreported)"),
        (
            {"writable_mounts": ["/workspace", "/home/agent/.cache", "/scratchpad"]},
            "writable mounts outside the output paths: /home/agent/.cache, /scratchpad",
        ),
        ({"writable_mounts": None}, "writable mounts outside the output paths: (unreported)"),
    ],
)
def test_each_filesystem_rule_refuses_a_boot_that_shows_the_violation(api_for, acme, violation, refusal):
    require_boot_reports(acme.tenant, runtime_audit=FILESYSTEM_RULES)
    api = api_for(acme)
    answer = api.post("/workers/me/boots", boot_body("boot-bad", {**CLEAN, **violation}))
    assert answer.status == 201, answer
    assert (answer.body["phase"], answer.body["failed_domains"], answer.body["not_ready_code"]) == (
        "PROCESS_UP",
        ["admission"],
        "NOT_READY",
    )
    boot = WorkerBoot.objects.get(worker=acme.worker)
    assert boot.readiness["admission"]["evidence"]["refused_by_policy"] == [refusal]
    refused = api.acquire(api.create_run(), "owner-1")
    assert (refused.status, refused.body["error"]) == (409, "NOT_READY")


def test_a_clean_boot_is_admitted_under_every_filesystem_rule(api_for, acme):
    require_boot_reports(acme.tenant, runtime_audit=FILESYSTEM_RULES)
    api = api_for(acme)
    answer = api.post("/workers/me/boots", boot_body("boot-clean", CLEAN))
    assert (answer.status, answer.body["phase"], answer.body["failed_domains"]) == (201, "READY", [])
    assert api.acquire(api.create_run(), "owner-1").status == 200


def test_a_runtime_audit_without_the_new_rules_judges_as_before(api_for, acme):
    """A policy written with only the first four rules does not judge the filesystem."""
    require_boot_reports(acme.tenant, runtime_audit=RUNTIME_AUDIT_RULES)
    api = api_for(acme)
    loose = {**CLEAN, "read_only_root": False, "no_new_privileges": False, "writable_mounts": ["/home/agent"]}
    answer = api.post("/workers/me/boots", boot_body("boot-loose", loose))
    assert (answer.status, answer.body["phase"]) == (201, "READY")


def test_a_malformed_admission_or_output_paths_is_refused_naming_the_field(acme):
    from ledger.errors import InvalidInput

    for document, field in (
        ({"admission": {"boot_report_required": "yes"}}, "policy.admission.boot_report_required"),
        ({"admission": {}}, "policy.admission"),
        ({"runtime_audit": {**RUNTIME_AUDIT_RULES, "output_paths": ["tmp"]}}, "policy.runtime_audit.output_paths"),
        (
            {"runtime_audit": {**RUNTIME_AUDIT_RULES, "allow_writable_root": 0}},
            "policy.runtime_audit.allow_writable_root",
        ),
        ({"runtime_audit": {**RUNTIME_AUDIT_RULES, "read_only": True}}, "policy.runtime_audit"),
    ):
        with pytest.raises(InvalidInput) as refused:
            policy_change(tenant=acme.tenant, document=document, reason="r", changed_by="a@example.com")
        assert refused.value.extra["fields"][0]["field"] == field


# --- the Python client boots before its first lease ---------------------------------------


def test_the_client_sends_its_boot_report_before_its_first_lease(live_server, acme):
    require_boot_reports(acme.tenant)
    worker = fl.Client(live_server.url, acme.token)
    assert not worker.booted
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=30) as lease:
        assert lease.token == 1
    (boot,) = WorkerBoot.objects.filter(worker=acme.worker)
    acquired = Event.objects.get(run_id=run_id, type="LEASE_ACQUIRED")
    assert boot.reported_at <= acquired.occurred_at
    assert boot.phase == "EXECUTING" and boot.code_version == fl.DEFAULT_CODE_VERSION
    audit = boot.readiness["runtime"]["evidence"]["audit"]
    assert {"no_new_privileges", "read_only_root", "writable_mounts"} <= set(audit)
    # Another Client of the same worker in the same process is the same process: no second boot.
    again = fl.Client(live_server.url, acme.token)
    assert again.booted
    with again.lease(again.create_run()) as second:
        assert second.token == 1
    assert WorkerBoot.objects.filter(worker=acme.worker).count() == 1


def test_a_worker_that_booted_itself_is_not_booted_again_by_the_client(live_server, acme):
    require_boot_reports(acme.tenant)
    worker = fl.Client(live_server.url, acme.token)
    worker.boot(config_hash="cfg-own", code_version="v7", readiness={**READY, "runtime": fl.runtime_readiness()})
    with worker.lease(worker.create_run()) as lease:
        assert lease.token == 1
    (boot,) = WorkerBoot.objects.filter(worker=acme.worker)
    assert boot.config_hash == "cfg-own"


def test_a_drained_process_does_not_boot_itself_back_into_work(live_server, acme):
    """drain() ends this process's start: its next lease is refused, not preceded by a boot
    that would make the drained worker ACCEPTING again."""
    worker = fl.Client(live_server.url, acme.token)
    run_id = worker.create_run()
    worker.drain(deadline_s=30, reason="SIGTERM")
    with pytest.raises(fl.WorkerNotAccepting):
        worker.lease(run_id).__enter__()
    assert not WorkerBoot.objects.filter(worker=acme.worker).exists()
