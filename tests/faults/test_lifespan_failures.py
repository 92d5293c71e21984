"""Failure injection for the lifespan of a run (article "Agent Lifespan Management", issue
12): its failure "Cleanup repeatedly fails", its scenario of a worker that disappears with
two browser sessions, a deployment drain, races for the last instance slot and the last
resource of a quota, and reapers that run twice at once or die mid-pass.

Every test ends with the article's invariants: nothing is RELEASED that its driver did not
confirm (or a person did not mark), no instance is RELEASED while a resource of it is open,
every chain is intact. Processes are spawned (a fresh interpreter) and connect to the
pytest-django test database named by the parent; they see only what was committed.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from ledger.errors import Denied
from ledger.models import CredentialLease, Event, LeaseGrant, ResourceAlert, Run, RunLease, RunResource, Worker
from ledger.services.authority.credential_leases import credential_lease_issue
from ledger.services.authority.credentials import credential_create
from ledger.services.authority.policy import policy_change
from ledger.services.fence.leases import lease_acquire, lease_release, leases_reap
from ledger.services.fleet.lifecycle import worker_drain
from ledger.services.lifespan.checkpoints import checkpoint_save
from ledger.services.lifespan.drivers import SandboxDriver
from ledger.services.lifespan.reaper import resources_reap
from ledger.services.lifespan.resources import Attach, resource_attach, resource_release
from tests.factories import leased_run, make_worker, new_run
from tests.helpers import assert_chain_intact, runs_held_elsewhere, subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)

LEAKING_WORKER = Path(__file__).with_name("leaking_worker.py")
SPAWN = multiprocessing.get_context("spawn")
CHILD = """
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
import django
django.setup()
from django.db import connections
connections["default"].settings_dict["NAME"] = db_name
connections["default"].ensure_connection()
import tests.faults.test_lifespan_failures as module
barrier.wait(120)  # every process is connected and ready: now they race
queue.put(getattr(module, entry)(*args))
"""


@pytest.fixture(autouse=True)
def sandbox_driver(tmp_path, settings, monkeypatch):
    """A fresh sandbox world per test, seen by this process and every process it starts."""
    root = tmp_path / "sandbox"
    settings.FENCELINE = {**settings.FENCELINE, "SANDBOX_DIR": root}
    monkeypatch.setenv("FENCELINE_SANDBOX_DIR", str(root))
    return SandboxDriver(root)


def spawned(entry: str, args_per_process: list[tuple]) -> list:
    """Run ``entry(*args)`` of this module in one spawned process per args, released together
    once all are connected; their results."""
    db_name = connection.settings_dict["NAME"]
    assert db_name.startswith("test_"), db_name
    queue, barrier = SPAWN.Queue(), SPAWN.Barrier(len(args_per_process))
    children = [
        SPAWN.Process(
            target=exec,
            args=(CHILD, {"db_name": db_name, "entry": entry, "args": args, "queue": queue, "barrier": barrier}),
        )
        for args in args_per_process
    ]
    for child in children:
        child.start()
    results = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0, child.exitcode
    return results


def attach(worker, run, token, handle, kind="browser_session"):
    resource, _ = resource_attach(
        worker=worker,
        run_id=run.pk,
        fencing_token=token,
        attach=Attach(kind=kind, provider="sandbox", handle=handle),
    )
    return resource


def make_due() -> None:
    """The test's clock for backoff: every waiting retry is due now."""
    RunResource.objects.filter(state="CLEANUP_FAILED").update(next_attempt_at=timezone.now())


def assert_lifespan_invariants(sandbox_driver: SandboxDriver) -> None:
    for resource in RunResource.objects.all():
        if resource.state == "RELEASED" and not resource.released_by.startswith("user:"):
            assert sandbox_driver.is_closed(resource.provider, resource.handle), resource.handle
            assert Event.objects.filter(type="RESOURCE_RELEASED", fields__resource_id=str(resource.pk)).count() == 1
    for instance in LeaseGrant.objects.filter(state="RELEASED"):
        assert not RunResource.objects.filter(instance=instance).exclude(state="RELEASED").exists()
    for run_id in Run.objects.values_list("pk", flat=True):
        assert_chain_intact(run_id)


# --- the article's failure: cleanup repeatedly fails ---------------------------------------


def test_cleanup_repeatedly_fails_retries_with_backoff_alerts_with_ownership_and_waits_for_the_driver(
    acme, sandbox_driver, settings, caplog
):
    settings.FENCELINE = {**settings.FENCELINE, "RESOURCE_ALERT_AFTER_FAILURES": 3}
    run, token = leased_run(acme.worker, owner="worker-a")
    stuck = attach(acme.worker, run, token, "portal-session?fail=5")
    credential_create(tenant=acme.tenant, principal="svc-portal", secret_ref="vault:portal/svc")
    lease = credential_lease_issue(
        worker=acme.worker,
        run_id=run.pk,
        fencing_token=token,
        principal="svc-portal",
        actions=["read"],
        resources=["portal:acme"],
        ttl_s=2,
    )
    credential = CredentialLease.objects.get(pk=lease.pk)
    RunLease.objects.filter(run=run).update(expires_at=timezone.now())  # the worker disappears
    assert leases_reap().leases == 1
    assert RunResource.objects.get(pk=stuck.pk).state == "RELEASE_REQUESTED"

    waits = []
    for attempt in range(1, 6):  # the driver fails five times
        before = timezone.now()
        result = resources_reap()
        assert (result.released, result.failed) == (0, 1), attempt
        resource = RunResource.objects.get(pk=stuck.pk)
        assert (resource.state, resource.attempts) == ("CLEANUP_FAILED", attempt)
        waits.append((resource.next_attempt_at - before).total_seconds())
        assert resources_reap().failed == 0  # not due yet: backoff holds the next call back
        make_due()
    # Exponential backoff with jitter: each wait within [0.5, 1] of 2, 4, 8, 16, 32 s.
    for attempt, wait in enumerate(waits, start=1):
        step = 2 * 2 ** (attempt - 1)
        assert 0.5 * step - 0.1 <= wait <= step + 0.1, (attempt, waits)
    # After three failures: one alert, stored and logged, with who owns the resource.
    alert = ResourceAlert.objects.get(resource=stuck.pk)
    assert alert.reason == "failures" and alert.cleared_at is None
    assert {"tenant", "run_id", "instance", "worker", "kind", "handle", "first_failed_at", "attempts"} <= set(
        alert.ownership
    )
    assert (alert.ownership["tenant"], alert.ownership["worker"], alert.ownership["attempts"]) == (
        "acme",
        "worker-1",
        3,
    )
    assert any("resource cleanup alert" in r.getMessage() for r in caplog.records)
    assert LeaseGrant.objects.get(run=run).state == "REAPING"  # never Released before cleanup is verified
    # The credential's expiry never waited for the cleanup.
    time.sleep(max(0, (credential.expires_at - timezone.now()).total_seconds()) + 0.1)
    assert CredentialLease.objects.get(pk=credential.pk).expires_at == credential.expires_at <= timezone.now()

    result = resources_reap()  # the sixth call succeeds
    assert result.released == 1 and result.instances_released == 1
    resource = RunResource.objects.get(pk=stuck.pk)
    assert (resource.state, resource.attempts, resource.released_by) == ("RELEASED", 6, "system:resource-reaper")
    assert ResourceAlert.objects.get(resource=stuck.pk).cleared_at is not None
    assert LeaseGrant.objects.get(run=run).state == "RELEASED"
    assert sandbox_driver.calls().count(f"sandbox portal-session?fail=5 {6}") == 1
    assert_lifespan_invariants(sandbox_driver)


# --- the article's scenario: a worker disappears with two sessions and a checkpoint --------


def test_a_sigkilled_worker_s_sessions_are_closed_by_the_reaper_and_a_new_worker_resumes(
    acme, api_for, live_server, sandbox_driver
):
    client = api_for(acme)
    run_id = client.create_run()
    env = {**os.environ, "FENCELINE_URL": live_server.url, "FENCELINE_TOKEN": acme.token}
    proc = subprocess.Popen([sys.executable, str(LEAKING_WORKER), run_id], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split() == ["READY"]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    sessions = list(RunResource.objects.filter(run_id=run_id).order_by("handle"))
    assert [s.state for s in sessions] == ["ACTIVE", "ACTIVE"]

    deadline = time.monotonic() + 10  # its 2 s lease runs out
    while RunLease.objects.get(run_id=run_id).expires_at > timezone.now():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert leases_reap().leases == 1
    assert LeaseGrant.objects.get(run_id=run_id).state == "EXPIRED"
    result = resources_reap()

    assert result.released == 2 and result.instances_released == 1
    assert all(sandbox_driver.is_closed("sandbox", s.handle) for s in sessions)
    assert LeaseGrant.objects.get(run_id=run_id).state == "RELEASED"
    replacement = api_for(make_worker("acme", "worker-2")).acquire(run_id, "worker-b")
    assert replacement.status == 200, replacement
    assert (replacement.body["fencing_token"], replacement.body["checkpoint"]["position"]) == (2, "supplier-7")
    assert replacement.body["checkpoint"]["state"] == {"done": 6}
    types = [e.type for e in assert_chain_intact(run_id)]
    assert types.count("RESOURCE_RELEASED") == 2 and types.index("INSTANCE_REAPING") < types.index("INSTANCE_RELEASED")
    assert_lifespan_invariants(sandbox_driver)


# --- deployment: drain -> checkpoint -> resources released -> instance Released ------------


def test_a_deployment_drain_checkpoints_releases_everything_and_leaves_nothing_active(acme, sandbox_driver):
    runs = [leased_run(acme.worker, owner="worker-a") for _ in range(2)]
    held = {run.pk: [attach(acme.worker, run, token, f"drain-{run.pk}-{n}") for n in (1, 2)] for run, token in runs}

    worker_drain(worker_id=acme.worker.pk, reason="deploy v2", name="admin", deadline_s=60)
    assert set(LeaseGrant.objects.values_list("state", flat=True)) == {"DRAINING"}
    acme.worker.refresh_from_db()
    # The worker's SIGTERM path: checkpoint, close its sessions, give the lease up.
    for run, token in runs:
        checkpoint_save(worker=acme.worker, run_id=run.pk, fencing_token=token, position="page-4", state={"n": 4})
        assert LeaseGrant.objects.get(run=run).state == "CHECKPOINTED"
        for resource in held[run.pk]:
            resource_release(worker=acme.worker, resource_id=resource.pk, fencing_token=token)
        lease_release(worker=acme.worker, run_id=run.pk, owner_id="worker-a", fencing_token=token)
        assert LeaseGrant.objects.get(run=run).state == "REAPING"  # until the driver confirms
    assert resources_reap().released == 4

    assert set(LeaseGrant.objects.values_list("state", flat=True)) == {"RELEASED"}
    assert not RunResource.objects.exclude(state="RELEASED").exists()
    for run, _ in runs:
        checkpointed = Event.objects.get(run=run, type="PROGRESS_CHECKPOINTED")
        assert checkpointed.fields["instance_state"] == "CHECKPOINTED"
    assert_lifespan_invariants(sandbox_driver)


# --- 16 processes for the last slot of a quota ---------------------------------------------


def acquire_one(worker_id: int, run_id: str, tool: str) -> str:
    worker = Worker.objects.select_related("tenant").get(pk=worker_id)
    try:
        lease_acquire(worker=worker, run_id=run_id, owner_id=f"p-{os.getpid()}", ttl_s=60, tool=tool)
        return "granted"
    except Denied as refused:
        return f"{refused.code} {refused.extra['quota']} {refused.extra['use']}/{refused.extra['limit']}"


def attach_one(worker_id: int, run_id: str, token: int, handle: str) -> str:
    worker = Worker.objects.select_related("tenant").get(pk=worker_id)
    try:
        resource_attach(
            worker=worker, run_id=run_id, fencing_token=token, attach=Attach("browser_session", "sandbox", handle)
        )
        return "granted"
    except Denied as refused:
        return f"{refused.code} {refused.extra['quota']}"


@pytest.mark.parametrize(
    ("quotas", "tool", "refusal"),
    [
        ({"instances_per_tenant": 3}, "", "DENY_QUOTA instances_per_tenant 3/3"),
        ({"instances_per_worker": 3}, "", "DENY_QUOTA instances_per_worker 3/3"),
        ({"instances_per_tool": {"browser": 3}}, "browser", "DENY_QUOTA instances_per_tool.browser 3/3"),
    ],
)
def test_sixteen_processes_racing_for_the_last_instance_slot_get_exactly_the_quota(acme, quotas, tool, refusal):
    policy_change(tenant=acme.tenant, document={"quotas": quotas}, reason="capacity", changed_by="admin")
    for _ in range(2):  # two of the three slots are taken
        run = new_run(acme.worker)
        lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="early", ttl_s=60, tool=tool)
    racing = [str(new_run(acme.worker).pk) for _ in range(16)]
    # Sixteen workers (one per process), so nothing but the quota serialises them; the
    # per-worker quota is raced by one worker from sixteen processes.
    per_worker = "instances_per_worker" in quotas
    workers = [acme.worker.pk if per_worker else make_worker("acme", f"racer-{n}").worker.pk for n in range(16)]

    results = spawned("acquire_one", [(worker, run_id, tool) for worker, run_id in zip(workers, racing, strict=True)])

    assert Counter(results) == Counter({"granted": 1, refusal: 15}), results
    assert LeaseGrant.objects.filter(tenant=acme.tenant, state__in=["RUNNING", "IDLE"]).count() == 3


def test_sixteen_processes_racing_for_the_last_resource_of_a_run_get_exactly_the_quota(acme, sandbox_driver):
    policy_change(
        tenant=acme.tenant,
        document={"quotas": {"resources_per_run": {"browser_session": 4}}},
        reason="four browsers",
        changed_by="admin",
    )
    run, token = leased_run(acme.worker, ttl_s=600)  # sixteen spawned interpreters start slowly on two busy cores
    for n in range(3):
        attach(acme.worker, run, token, f"early-{n}")

    results = spawned("attach_one", [(acme.worker.pk, str(run.pk), token, f"race-{n}") for n in range(16)])

    assert Counter(results) == Counter({"granted": 1, "DENY_QUOTA resources_per_run.browser_session": 15}), results
    assert RunResource.objects.filter(run=run).count() == 4
    assert_lifespan_invariants(sandbox_driver)


# --- reapers: two at once, and one killed mid-pass ----------------------------------------


def requested_resources(worker, count: int, handle: str = "r-{n}") -> list[RunResource]:
    run, token = leased_run(worker)
    resources = [attach(worker, run, token, handle.format(n=n)) for n in range(count)]
    RunLease.objects.filter(run=run).update(expires_at=timezone.now())
    leases_reap()
    assert RunResource.objects.filter(state="RELEASE_REQUESTED").count() == count
    return resources


def reap_once(batch_size: int) -> dict:
    result = resources_reap(batch_size=batch_size)
    return {"released": result.released, "failed": result.failed}


def test_two_reapers_at_once_close_each_resource_once(acme, sandbox_driver):
    resources = requested_resources(acme.worker, 60)

    results = spawned("reap_once", [(7,), (7,)])

    assert sum(r["released"] for r in results) == 60 and all(r["failed"] == 0 for r in results), results
    calls = Counter(line.split()[1] for line in sandbox_driver.calls())
    assert calls == Counter({r.handle: 1 for r in resources})  # each driver call made exactly once
    assert not RunResource.objects.exclude(state="RELEASED").exists()
    assert_lifespan_invariants(sandbox_driver)


def test_a_reaper_killed_mid_pass_loses_and_duplicates_nothing(acme, sandbox_driver, settings):
    resources = requested_resources(acme.worker, 6, handle="slow-{n}?hang=30")
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "reap_resources", "--batch-size", "3"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while RunResource.objects.filter(state="RELEASING").count() < 3:  # claimed, calling the driver
            assert time.monotonic() < deadline, "the reaper never claimed"
            time.sleep(0.1)
        while len(sandbox_driver.calls()) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    claimed = set(RunResource.objects.filter(state="RELEASING").values_list("pk", flat=True))
    assert len(claimed) == 3  # nothing lost: still claimed, not released, not forgotten
    assert not Event.objects.filter(type="RESOURCE_RELEASED").exists()

    # The claims expire; the next pass claims them again (the sandbox hangs on a first call
    # only). The three never claimed hang on their first call: given up at the timeout.
    settings.FENCELINE = {**settings.FENCELINE, "RESOURCE_CLOSE_TIMEOUT_S": 1}
    RunResource.objects.filter(pk__in=claimed).update(claim_expires_at=timezone.now())
    result = resources_reap()
    assert (result.released, result.failed) == (3, 3), result
    assert set(RunResource.objects.filter(state="RELEASED").values_list("pk", flat=True)) == claimed
    make_due()
    assert resources_reap().released == 3

    assert not RunResource.objects.exclude(state="RELEASED").exists()
    for resource in resources:
        assert Event.objects.filter(type="RESOURCE_RELEASED", fields__resource_id=str(resource.pk)).count() == 1
    assert_lifespan_invariants(sandbox_driver)


def test_the_reaper_asks_past_runs_busy_elsewhere_for_their_overdue_resources(acme, sandbox_driver):
    """Copies at once (``reap_resources --processes 2``) split the first step too: when every
    run of a batch of overdue resources is locked by the other copy, this one reads on without
    those runs instead of ending the step. Here another connection holds the run whose two
    resources come first; three more runs have one overdue resource each."""
    runs = []
    for n in range(4):
        run, token = leased_run(acme.worker)
        runs.append(run)
        for m in range(2 if n == 0 else 1):
            attach(acme.worker, run, token, f"overdue-{n}-{m}")
    RunResource.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    # The held run's come first in any order the read may take: the oldest deadline (the
    # expiry index's order), and the first written (the table's).
    RunResource.objects.filter(run=runs[0]).update(expires_at=timezone.now() - timedelta(hours=1))
    with runs_held_elsewhere([runs[0].pk]):
        result = resources_reap(batch_size=1)

    assert (result.requested, result.released) == (3, 3), result
    states = dict(RunResource.objects.values_list("handle", "state"))
    assert states == {
        "overdue-0-0": "ACTIVE",
        "overdue-0-1": "ACTIVE",
        **{f"overdue-{n}-0": "RELEASED" for n in (1, 2, 3)},
    }
    result = resources_reap(batch_size=1)  # the next pass takes the held run's
    assert (result.requested, result.released) == (2, 2), result
    assert_lifespan_invariants(sandbox_driver)
