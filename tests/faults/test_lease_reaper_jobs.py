"""The lease reaper as it runs in production: Celery beat firing ``reap_leases_task`` on a
real worker over Redis, and operators running ``manage.py reap_leases`` — twice at once.

Every test sets its runs up through the services, then moves the leases' ``expires_at``
into the past in the database: that is the test's clock. The subprocesses use the
pytest-django test database, so these tests are ``transaction=True``: they can only see
committed rows. Whatever the reaper does, it must do exactly once per lease and per
operation, however many times or however many reapers run.
"""

import ast
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.actors import SYSTEM_REAPER
from ledger.chain import GENESIS_HASH, canonical_bytes, format_time, hash_bytes
from ledger.models import Event, LeaseGrant, Operation, Run, RunLease
from ledger.services.fence.leases import lease_acquire, lease_release, leases_reap
from ledger.tasks import reap_leases_task
from tests.factories import dispatched_operation, expire, leased_run, new_run
from tests.helpers import subprocess_database_url

REDIS_URL = os.environ.get("FENCELINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
OWNER = "worker-a"
REPORT_LINE = re.compile(r"^reaped (\d+) expired leases; (\d+) operations now UNKNOWN$", re.MULTILINE)
TASK_SUCCEEDED = re.compile(r"reap_leases_task\[[^\]]+\] succeeded in [0-9.e-]+s: (\{[^}]*\})")


# --- setting runs up through the services ------------------------------------------------


@dataclass
class LeasedRun:
    run_id: object
    token: int
    op_ids: list = field(default_factory=list)


def dispatched_run(identity, *, ops: int, ttl_s: int = 300, owner: str = OWNER) -> LeasedRun:
    """A run whose lease ``owner`` holds, with ``ops`` operations DISPATCHED under it."""
    run, token = leased_run(identity.worker, owner=owner, ttl_s=ttl_s)
    op_ids = [dispatched_operation(identity.worker, run, token, f"reaper:{run.pk}:{i}").pk for i in range(ops)]
    return LeasedRun(run_id=run.pk, token=token, op_ids=op_ids)


def expire_all(runs: list[LeasedRun]) -> None:
    """Move the leases' expiry one second into the past: the test's clock."""
    assert expire(*[r.run_id for r in runs]) == len(runs)


def expired_runs(identity, ops_per_run: list[int]) -> list[LeasedRun]:
    runs = [dispatched_run(identity, ops=ops) for ops in ops_per_run]
    expire_all(runs)
    return runs


# --- what "reaped exactly once" means -------------------------------------------------------


def chain_problems(run: Run, events: list[Event]) -> list[str]:
    """The run's chain is seq 1..last_seq, each event linked to and hashed over the previous one."""
    problems = []
    if [e.seq for e in events] != list(range(1, run.last_seq + 1)):
        problems.append(f"run {run.pk}: seqs {[e.seq for e in events]} are not 1..{run.last_seq}")
    prev = GENESIS_HASH
    for e in events:
        digest = hash_bytes(
            canonical_bytes(
                run_id=str(e.run_id),
                seq=e.seq,
                event_id=str(e.event_id),
                type=e.type,
                schema_version=e.schema_version,
                actor=e.actor,
                occurred_at=format_time(e.occurred_at),
                fields=e.fields,
                prev_hash=e.prev_hash,
            )
        )
        if e.prev_hash != prev or e.hash != digest:
            problems.append(f"run {run.pk}: chain broken at seq {e.seq} ({e.type})")
            break
        prev = e.hash
    if events and run.last_hash != events[-1].hash:
        problems.append(f"run {run.pk}: last_hash is not the hash of its last event")
    return problems


def reaped_problems(runs: list[LeasedRun]) -> list[str]:
    """Everything that is not (yet) "each lease reaped once": empty when all is done, exactly once."""
    run_ids = [r.run_id for r in runs]
    op_ids = [op for r in runs for op in r.op_ids]
    leases = {lease.run_id: lease for lease in RunLease.objects.filter(run_id__in=run_ids)}
    chains = {run.pk: run for run in Run.objects.filter(pk__in=run_ids)}
    grants = defaultdict(list)
    for grant in LeaseGrant.objects.filter(run_id__in=run_ids):
        grants[grant.run_id].append(grant)
    events = defaultdict(list)
    for event in Event.objects.filter(run_id__in=run_ids).order_by("run_id", "seq"):
        events[event.run_id].append(event)
    phases = dict(Operation.objects.filter(pk__in=op_ids).values_list("pk", "phase"))
    cases = defaultdict(list)
    for case in ReconciliationCase.objects.filter(operation_id__in=op_ids):
        cases[case.operation_id].append(case)

    problems = []
    for r in runs:
        lease = leases[r.run_id]
        if (lease.owner_id, lease.worker_id, lease.fencing_token) != (None, None, r.token):
            problems.append(f"run {r.run_id}: lease {(lease.owner_id, lease.worker_id, lease.fencing_token)}")
        ends = [(g.fencing_token, g.end_reason, g.ended_at is not None, g.state) for g in grants[r.run_id]]
        if ends != [(r.token, "EXPIRED", True, "EXPIRED")]:  # the instance is EXPIRED, for the resource reaper
            problems.append(f"run {r.run_id}: grants {ends}")
        chain = events[r.run_id]
        expired = [e for e in chain if e.type == "LEASE_EXPIRED"]
        if [(e.actor, e.fields) for e in expired] != [
            (SYSTEM_REAPER, {"owner_id": OWNER, "fencing_token": r.token, "instance_state": "EXPIRED"})
        ]:
            problems.append(f"run {r.run_id}: LEASE_EXPIRED events {[(e.actor, e.fields) for e in expired]}")
        unknown = defaultdict(list)  # operation id -> the case ids its OPERATION_UNKNOWN events name
        for e in chain:
            if e.type == "OPERATION_UNKNOWN":
                unknown[e.fields.get("operation_id")].append(e.fields.get("case_id"))
        if Counter({op: len(ids) for op, ids in unknown.items()}) != Counter(str(op) for op in r.op_ids):
            problems.append(f"run {r.run_id}: OPERATION_UNKNOWN events per operation {dict(unknown)}")
        for op in r.op_ids:
            if phases[op] != "UNKNOWN":
                problems.append(f"operation {op}: {phases[op]}")
            op_cases = [(c.reason, c.status, c.attempt) for c in cases[op]]
            if op_cases != [("LEASE_LOST", "OPEN", 1)]:
                problems.append(f"operation {op}: cases {op_cases}")
            elif unknown[str(op)] != [str(cases[op][0].pk)]:
                problems.append(f"operation {op}: OPERATION_UNKNOWN does not name its case")
        problems.extend(chain_problems(chains[r.run_id], chain))
    return problems


def snapshot(run_ids: list) -> dict:
    """Everything the reaper could change about these runs."""
    leases = RunLease.objects.filter(run_id__in=run_ids)
    grants = LeaseGrant.objects.filter(run_id__in=run_ids)
    return {
        "leases": sorted(leases.values_list("run_id", "owner_id", "worker_id", "fencing_token", "expires_at")),
        "grants": sorted(grants.values_list("run_id", "fencing_token", "ended_at", "end_reason")),
        "heads": sorted(Run.objects.filter(pk__in=run_ids).values_list("pk", "last_seq", "last_hash")),
        "events": Event.objects.filter(run_id__in=run_ids).count(),
        "phases": sorted(Operation.objects.filter(run_id__in=run_ids).values_list("pk", "phase")),
        "cases": sorted(ReconciliationCase.objects.filter(run_id__in=run_ids).values_list("operation_id", "reason")),
    }


# --- subprocesses on the test database -------------------------------------------------------


def subprocess_env(**extra: str) -> dict:
    return {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "DB_CONN_MAX_AGE": "0",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def tail(path: Path, limit: int = 8000) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no output)"
    return text[-limit:]


def task_results(log: Path) -> list[dict]:
    """The return values of the reaper task runs the worker logged as succeeded."""
    return [ast.literal_eval(m.group(1)) for m in TASK_SUCCEEDED.finditer(log.read_text(errors="replace"))]


def blocked_on(table: str) -> int:
    """Sessions of this database waiting for a lock on ``table``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE d.datname = current_database() AND l.relation = %s::regclass AND NOT l.granted",
            [table],
        )
        return cursor.fetchone()[0]


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_celery_beat_runs_the_reaper_against_redis(acme, tmp_path):
    runs = expired_runs(acme, [1, 2, 3])
    op_ids = [op for r in runs for op in r.op_ids]
    assert Operation.objects.filter(pk__in=op_ids, phase="DISPATCHED").count() == 6

    broker = redis.Redis.from_url(REDIS_URL)
    broker.flushdb()
    log = tmp_path / "celery.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--beat",
                "--pool=solo",
                "--concurrency=1",
                "-s",
                str(tmp_path / "beat-schedule"),
                "--loglevel=INFO",
            ],
            cwd=settings.BASE_DIR,
            env=subprocess_env(CELERY_BROKER_URL=REDIS_URL, FENCELINE_REAPER_INTERVAL_S="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while problems := reaped_problems(runs):
            assert worker.poll() is None, f"the worker exited with {worker.returncode}:\n{tail(log)}"
            assert time.monotonic() < deadline, f"not reaped within 60 s: {problems[:5]}\n{tail(log)}"
            time.sleep(0.2)
        # Let beat fire a few more times over leases that are already reaped.
        deadline = time.monotonic() + 30
        while len(task_results(log)) < 3:
            assert worker.poll() is None, f"the worker exited with {worker.returncode}:\n{tail(log)}"
            assert time.monotonic() < deadline, f"beat did not run the reaper three times in 30 s:\n{tail(log)}"
            time.sleep(0.2)
    finally:
        stop(worker)
        broker.flushdb()

    output = tail(log)
    assert reaped_problems(runs) == [], output
    results = task_results(log)
    assert len(results) >= 3, output
    assert sum(r["leases"] for r in results) == len(runs), output
    assert sum(r["operations"] for r in results) == len(op_ids), output
    assert results[-1] == {"leases": 0, "operations": 0, "batches": 0}, output


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_reap_command_twice_at_once_gives_the_same_result_as_once(acme):
    runs = expired_runs(acme, [1 + i % 2 for i in range(60)])
    command = [sys.executable, "manage.py", "reap_leases", "--batch-size", "7"]
    env = subprocess_env()
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}

    # A starting gate: while this transaction holds the lease table, both reapers wait at
    # their first FOR UPDATE; they are released together once both are waiting.
    procs = []
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("LOCK TABLE ledger_runlease IN EXCLUSIVE MODE")
            for _ in range(2):
                procs.append(subprocess.Popen(command, cwd=settings.BASE_DIR, env=env, **pipes))
            deadline = time.monotonic() + 30
            while blocked_on("ledger_runlease") < 2:
                exited = [p.communicate() for p in procs if p.poll() is not None]
                assert not exited, f"a reaper exited before reaching the gate: {exited}"
                assert time.monotonic() < deadline, "the reapers did not reach the gate within 30 s"
                time.sleep(0.05)
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)

    assert [p.returncode for p in procs] == [0, 0], outputs
    reports = [REPORT_LINE.findall(out) for out, _ in outputs]
    assert all(len(r) == 1 for r in reports), outputs
    leases, operations = (sum(int(r[0][i]) for r in reports) for i in (0, 1))
    assert (leases, operations) == (len(runs), sum(len(r.op_ids) for r in runs)), outputs
    assert reaped_problems(runs) == []

    third = StringIO()
    call_command("reap_leases", "--batch-size", "7", stdout=third, stderr=StringIO())
    assert REPORT_LINE.findall(third.getvalue()) == [("0", "0")]
    assert reaped_problems(runs) == []


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_reap_command_in_two_processes_reaps_each_lease_once_and_both_take_batches(acme):
    """``reap_leases --processes 2`` for a backlog: two forked copies split the batches
    (SKIP LOCKED) and together do what one would, each lease and operation once."""
    runs = expired_runs(acme, [1 + i % 2 for i in range(60)])
    command = [sys.executable, "manage.py", "reap_leases", "--batch-size", "7", "--processes", "2"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    # The same starting gate: both copies wait at their first claim, then start together.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE ledger_runlease IN EXCLUSIVE MODE")
        proc = subprocess.Popen(command, cwd=settings.BASE_DIR, env=subprocess_env(), **pipes)
        deadline = time.monotonic() + 30
        while blocked_on("ledger_runlease") < 2:
            assert proc.poll() is None, f"the command exited before reaching the gate: {proc.communicate()}"
            assert time.monotonic() < deadline, "the two copies did not reach the gate within 30 s"
            time.sleep(0.05)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    assert proc.returncode == 0, (out, err)
    assert REPORT_LINE.findall(out) == [(str(len(runs)), str(sum(len(r.op_ids) for r in runs)))], (out, err)
    assert re.search(r"^  \[0\] batch 1:", err, re.MULTILINE), err  # each copy took at least one batch
    assert re.search(r"^  \[1\] batch 1:", err, re.MULTILINE), err
    assert reaped_problems(runs) == []


@pytest.mark.django_db(transaction=True)
def test_reap_leases_task_eager(acme):
    held = dispatched_run(acme, ops=1)
    [expired] = expired_runs(acme, [2])
    before = snapshot([held.run_id])

    result = reap_leases_task.apply()

    assert result.successful(), result.traceback
    assert result.get() == {"leases": 1, "operations": 2, "batches": 1}
    assert reaped_problems([expired]) == []
    assert snapshot([held.run_id]) == before
    assert reap_leases_task.apply().get() == {"leases": 0, "operations": 0, "batches": 0}
    assert reaped_problems([expired]) == []


@pytest.mark.django_db(transaction=True)
def test_reaper_leaves_unexpired_and_released_leases_alone(acme):
    unexpired = dispatched_run(acme, ops=2)
    released = dispatched_run(acme, ops=1)
    lease_release(worker=acme.worker, run_id=released.run_id, owner_id=OWNER, fencing_token=released.token)
    never_leased = new_run(acme.worker)
    [expired] = expired_runs(acme, [1])
    # A takeover of an expired lease: held again, by a new owner with the next token.
    taken_over = dispatched_run(acme, ops=1)
    expire_all([taken_over])
    lease_acquire(worker=acme.worker, run_id=taken_over.run_id, owner_id="worker-b", ttl_s=300)

    alone = [unexpired.run_id, released.run_id, never_leased.pk, taken_over.run_id]
    before = snapshot(alone)
    # A released lease has no owner and an expiry in the past: not the reaper's.
    assert RunLease.objects.get(run_id=released.run_id).expires_at <= timezone.now()

    result = leases_reap(batch_size=2)

    assert (result.leases, result.operations) == (1, 1)
    assert reaped_problems([expired]) == []
    assert snapshot(alone) == before
    assert Operation.objects.get(pk=unexpired.op_ids[0]).phase == "DISPATCHED"
    assert RunLease.objects.get(run_id=unexpired.run_id).owner_id == OWNER
    assert RunLease.objects.get(run_id=taken_over.run_id).owner_id == "worker-b"
    assert list(ReconciliationCase.objects.filter(run_id=released.run_id).values_list("reason", flat=True)) == [
        "LEASE_RELEASED"
    ]
    assert not Event.objects.filter(run_id__in=alone, type="LEASE_EXPIRED", actor=SYSTEM_REAPER).exists()
