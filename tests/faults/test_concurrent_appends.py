"""Concurrent appends to one run never fork the chain; appends to other runs go on."""

from ledger.models import Event
from ledger.services.evidence.verification import run_verify
from tests.helpers import assert_chain_intact, run_concurrently

THREADS = 16
PER_THREAD = 8


def test_sixteen_threads_appending_to_one_run_make_one_contiguous_chain(api_for, acme):
    owner = api_for(acme)
    run_id = owner.create_run()
    owner.acquire(run_id, "worker-a")
    clients = [api_for(acme) for _ in range(THREADS)]

    def append(i: int):
        return [
            clients[i].post(
                f"/runs/{run_id}/events", {"fencing_token": 1, "type": "x.step", "fields": {"thread": i, "n": n}}
            )
            for n in range(PER_THREAD)
        ]

    results = [r for batch in run_concurrently(append, THREADS) for r in batch]

    assert {r.status for r in results} == {201}
    seqs = sorted(r.body["seq"] for r in results)
    assert len(set(seqs)) == THREADS * PER_THREAD  # every append got its own seq
    events = assert_chain_intact(run_id)
    assert len([e for e in events if e.type == "x.step"]) == THREADS * PER_THREAD
    assert {r.body["hash"] for r in results} <= {e.hash for e in events}
    report = run_verify(run_id=run_id)
    assert report.finding is None, report


def test_appends_to_different_runs_in_parallel_each_stay_contiguous(api_for, acme):
    owner = api_for(acme)
    runs = [owner.create_run() for _ in range(4)]
    for run_id in runs:
        owner.acquire(run_id, "worker-a")
    clients = [api_for(acme) for _ in range(THREADS)]

    def append(i: int):
        run_id = runs[i % len(runs)]
        return [
            clients[i].post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"n": n}})
            for n in range(PER_THREAD)
        ]

    results = [r for batch in run_concurrently(append, THREADS) for r in batch]

    assert {r.status for r in results} == {201}
    for run_id in runs:
        assert_chain_intact(run_id)
        assert Event.objects.filter(run_id=run_id, type="NOTE").count() == THREADS // len(runs) * PER_THREAD
