"""The restart-loop article's failure matrix over HTTP (issue 13, items 3 and 4): a bad
config boots NOT_READY with its config hash and takes no claims; an expired credential is
CREDENTIALS_NOT_READY; a ready boot admits again; consecutive crashes form an episode whose
boots are answered min(300, 2^n) s, and the restart past the budget quarantines the worker
with its boots as the diagnostic bundle."""

import pytest

from ledger import client as fl
from ledger.models import AdminAction, Worker, WorkerBoot

READY = {d: {"ok": True, "evidence": {}} for d in ("runtime", "state", "credentials", "outbound_delivery", "admission")}


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
