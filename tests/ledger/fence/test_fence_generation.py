"""The fence's generation: token arithmetic and its bounds, the database's own bounds, and
fence_restore on a database whose clock is behind the fence (the restore itself, with a real
pg_dump/pg_restore: tests/faults/test_restore_fence.py)."""

import time

import pytest
from django.db import IntegrityError, transaction

from ledger.models import FenceGeneration, RunLease
from ledger.models.runs import FENCE_GENERATION_MAX, FENCE_GENERATION_SHIFT, FENCING_TOKEN_MAX
from ledger.services.fence import leases
from ledger.services.fence.generation import generation_next, token_floor, token_next
from ledger.services.fence.restore import fence_restore
from tests.factories import expire, leased_run, new_run

NOW_S = 1_796_000_000  # December 2026


def test_tokens_stay_exact_in_a_javascript_number_until_2242():
    assert FENCING_TOKEN_MAX == 2**53 - 1
    assert token_floor(FENCE_GENERATION_MAX) <= FENCING_TOKEN_MAX < token_floor(FENCE_GENERATION_MAX) + 2**20
    assert time.gmtime(FENCE_GENERATION_MAX).tm_year == 2242
    assert token_floor(NOW_S) == NOW_S * 2**FENCE_GENERATION_SHIFT


def test_generation_zero_issues_the_previous_token_plus_one():
    assert token_next(previous=0, generation=0) == 1
    assert token_next(previous=41, generation=0) == 42


def test_a_new_generation_issues_its_floor_then_counts_up():
    floor = token_floor(NOW_S)
    assert token_next(previous=3, generation=NOW_S) == floor
    assert token_next(previous=floor, generation=NOW_S) == floor + 1
    # A run that counted past the floor keeps counting: tokens never go back.
    assert token_next(previous=floor + 5, generation=NOW_S) == floor + 6


def test_every_token_of_an_earlier_generation_is_below_a_later_floor():
    busiest = token_floor(NOW_S) + 2**20 - 1  # a million takeovers of one run in the generation's first second
    assert busiest < token_floor(NOW_S + 1)


def test_no_token_past_two_to_the_53_and_no_generation_out_of_range():
    assert token_next(previous=FENCING_TOKEN_MAX - 1, generation=0) == FENCING_TOKEN_MAX
    with pytest.raises(OverflowError):
        token_next(previous=FENCING_TOKEN_MAX, generation=0)
    with pytest.raises(OverflowError):
        token_floor(FENCE_GENERATION_MAX + 1)
    with pytest.raises(OverflowError):
        token_floor(-1)


def test_a_restore_moves_to_the_clock_second_when_the_clock_is_ahead():
    moved = generation_next(stored=0, clock_s=NOW_S, top_token=1_000)
    assert (moved.generation, moved.clock_ahead) == (NOW_S, True)


def test_a_clock_behind_the_stored_generation_or_tokens_still_moves_past_them_and_says_so():
    behind = generation_next(stored=NOW_S, clock_s=NOW_S - 60, top_token=token_floor(NOW_S) + 7)
    assert (behind.generation, behind.clock_ahead) == (NOW_S + 1, False)
    past_tokens = generation_next(stored=0, clock_s=NOW_S, top_token=token_floor(NOW_S + 10))
    assert (past_tokens.generation, past_tokens.clock_ahead) == (NOW_S + 11, False)
    same_second = generation_next(stored=NOW_S, clock_s=NOW_S, top_token=0)
    assert (same_second.generation, same_second.clock_ahead) == (NOW_S + 1, False)


@pytest.mark.django_db
def test_the_database_refuses_a_token_past_two_to_the_53_and_a_second_generation_row(acme):
    run, _ = leased_run(acme.worker)
    with pytest.raises(IntegrityError), transaction.atomic():
        RunLease.objects.filter(run=run).update(fencing_token=FENCING_TOKEN_MAX + 1)
    with pytest.raises(IntegrityError), transaction.atomic():
        FenceGeneration.objects.create(id=2, generation=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        FenceGeneration.objects.filter(pk=1).update(generation=FENCE_GENERATION_MAX + 1)


@pytest.mark.django_db
def test_after_fence_restore_a_run_with_no_lease_gets_the_new_floor(acme):
    idle = new_run(acme.worker)
    held, token = leased_run(acme.worker, ttl_s=600)
    restored = fence_restore(by="olga")
    assert restored.clock_ahead and restored.problem == ""
    assert (restored.leases_ended, restored.runs_recorded) == (1, 1)  # only the held run is touched
    floor = token_floor(restored.generation)
    fresh = leases.lease_acquire(worker=acme.worker, run_id=idle.pk, owner_id="owner-x", ttl_s=60)
    again = leases.lease_acquire(worker=acme.worker, run_id=held.pk, owner_id="owner-y", ttl_s=60)
    assert (fresh.fencing_token, again.fencing_token) == (floor, floor)
    assert again.fencing_token > token


@pytest.mark.django_db
def test_fence_restore_with_the_clock_behind_moves_past_the_fence_and_names_the_problem(acme):
    run, _ = leased_run(acme.worker)
    ahead = int(time.time()) + 3600  # a generation an hour in this host's future
    FenceGeneration.objects.filter(pk=1).update(generation=ahead)
    restored = fence_restore(by="olga")
    assert (restored.generation, restored.clock_ahead) == (ahead + 1, False)
    assert "clock is behind the fence" in restored.problem
    expire(run)
    taken = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-z", ttl_s=60)
    assert taken.fencing_token == token_floor(ahead + 1)


@pytest.mark.django_db(transaction=True)
def test_over_http_the_token_after_a_restore_is_an_integer_the_worker_echoes(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    restored = fence_restore(by="olga")
    taken = client.acquire(run_id, "worker-a", ttl_s=60)
    assert taken.status == 200 and taken.body["fencing_token"] == token_floor(restored.generation)
    token = taken.body["fencing_token"]
    assert type(token) is int and token <= FENCING_TOKEN_MAX
    renewed = client.post(f"/runs/{run_id}/lease/renew", {"owner_id": "worker-a", "fencing_token": token, "ttl_s": 60})
    assert renewed.status == 200, renewed
    stale = client.post(
        f"/runs/{run_id}/lease/renew", {"owner_id": "worker-a", "fencing_token": token - 1, "ttl_s": 60}
    )
    assert stale.status == 409, stale
