"""The case timers' job and people racing on the same overdue cases, in separate processes
against real PostgreSQL: each case ends with exactly one outcome — claimed by one person
(one CASE_CLAIMED, no escalation) or escalated by the job (one CASE_ESCALATED, every claim
refused with the case's state) — never both, never twice."""

import multiprocessing
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from approvals.models import ReconciliationCase
from ledger.models import Event
from tests.factories import unknown_case, user_with
from tests.helpers import SPAWN, assert_chain_intact, spawned

CASES = 6
JOBS = 2
PEOPLE = 4

pytestmark = pytest.mark.django_db(transaction=True)


def process(entry: str, *args) -> multiprocessing.Process:
    return spawned("tests.faults.test_case_timer_person_race", entry, *args)


def _job(barrier, results) -> None:
    from approvals.services.case_timers import cases_enforce_timers

    try:
        barrier.wait(60)
        results.put(("job", cases_enforce_timers().escalated))
    except BaseException as exc:
        results.put(("job", f"error {type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()


def _person(case_ids: list[str], barrier, results) -> None:
    from approvals.services.cases import case_claim
    from ledger.errors import WrongPhase

    try:
        user = get_user_model().objects.get(username="olga")
        barrier.wait(60)
        won = 0
        for case_id in case_ids:
            try:
                case_claim(case_id=case_id, user=user)
                won += 1
            except WrongPhase:
                pass
        results.put(("person", won))
    except BaseException as exc:
        results.put(("person", f"error {type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()


def test_the_job_and_people_claiming_the_same_cases_make_exactly_one_outcome_each(acme):
    user_with("operator", acme.tenant, "olga")
    cases = [unknown_case(acme.worker, key=f"race-{i}") for i in range(CASES)]
    # Each waited past the escalation time (2 h); a claim made now is far from expiring (30 min).
    ReconciliationCase.objects.update(opened_at=timezone.now() - timedelta(hours=3))
    connections.close_all()

    ids = [str(c.pk) for c in cases]
    barrier, results = SPAWN.Barrier(JOBS + PEOPLE), SPAWN.Queue()
    racers = [process("_job", barrier, results) for _ in range(JOBS)]
    # People take the cases in different orders, so they meet the job at different cases.
    racers += [process("_person", ids if i % 2 else ids[::-1], barrier, results) for i in range(PEOPLE)]
    seen = [results.get(timeout=180) for _ in racers]
    for racer in racers:
        racer.join(60)
        assert racer.exitcode == 0
    assert not [s for s in seen if isinstance(s[1], str)], seen

    escalated = sum(n for who, n in seen if who == "job")
    claimed = sum(n for who, n in seen if who == "person")
    assert escalated + claimed == CASES, seen
    for case in cases:
        case.refresh_from_db()
        events = list(
            Event.objects.filter(run_id=case.run_id, type__in=["CASE_CLAIMED", "CASE_ESCALATED"]).values_list(
                "type", flat=True
            )
        )
        if case.status == "CLAIMED":
            assert (events, case.claimed_by, case.escalated_by) == (["CASE_CLAIMED"], "olga", "")
        else:
            assert (case.status, events, case.escalated_by) == ("ESCALATED", ["CASE_ESCALATED"], "system:case-timers")
        assert_chain_intact(case.run_id)
