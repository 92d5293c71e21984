"""The case timers (approvals/services/case_timers.py): a claim expires after the tenant's
acknowledge time, an unclaimed case escalates after its escalation time, each with one event
by ``system:case-timers``; the job run again writes nothing; an escalation is one webhook
notification; the policy's ``case_timers`` are the tenant's own."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals.models import ReconciliationCase
from approvals.services.case_timers import cases_enforce_timers
from approvals.services.cases import case_claim, case_escalate, case_reassign
from approvals.services.notifications import notifications_scan
from approvals.tasks import enforce_case_timers_task
from ledger.errors import InvalidInput
from ledger.models import Event, WebhookDelivery
from ledger.policy import case_timers_of, starter_policy, validate_policy
from tests.factories import set_policy, unknown_case, unknown_cases, user_with, webhook_endpoint


def later(**delta) -> timezone.datetime:
    return timezone.now() + timedelta(**delta)


def timer_events(case) -> list[tuple[str, str]]:
    return list(
        Event.objects.filter(run_id=case.run_id, actor="system:case-timers")
        .order_by("seq")
        .values_list("type", "actor")
    )


def test_the_starter_timers_are_thirty_minutes_to_acknowledge_and_two_hours_to_escalate():
    assert case_timers_of(starter_policy()) == {"ack_s": 1800, "escalate_s": 7200}
    assert case_timers_of({}) == {"ack_s": 1800, "escalate_s": 7200}  # a policy stored before them


@pytest.mark.parametrize("bad", [{"ack_s": 0, "escalate_s": 60}, {"ack_s": 60}, {"ack_s": "1", "escalate_s": 60}, 5])
def test_a_policy_with_bad_case_timers_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidInput) as refused:
        validate_policy({"case_timers": bad})
    assert str(refused.value.detail).startswith("policy.case_timers")


def test_a_claim_expires_after_the_acknowledge_time_and_the_case_is_unclaimed_again(acme, operator):
    case = unknown_case(acme.worker)
    case_claim(case_id=case.pk, user=operator)
    assert cases_enforce_timers(now=later(minutes=29)).claims_expired == 0
    result = cases_enforce_timers(now=later(minutes=31))
    case.refresh_from_db()
    assert (result.claims_expired, result.escalated) == (1, 0)
    assert (case.status, case.claimed_by, case.claimed_at) == ("OPEN", "", None)
    event = Event.objects.get(run_id=case.run_id, type="CASE_CLAIM_EXPIRED")
    assert event.actor == "system:case-timers"
    assert (event.fields["claimed_by"], event.fields["case_id"]) == ("olga", str(case.pk))


def test_an_unclaimed_case_escalates_after_the_escalation_time(acme):
    case = unknown_case(acme.worker)
    assert cases_enforce_timers(now=later(minutes=119)).escalated == 0
    assert cases_enforce_timers(now=later(minutes=121)).escalated == 1
    case.refresh_from_db()
    assert (case.status, case.escalated_by) == ("ESCALATED", "system:case-timers")
    assert case.escalation_reason == "unclaimed for longer than 2 h" and case.escalated_at is not None
    assert timer_events(case) == [("CASE_ESCALATED", "system:case-timers")]


def test_an_expired_claim_past_the_escalation_time_escalates_in_the_same_pass(acme, operator):
    case = unknown_case(acme.worker)
    case_claim(case_id=case.pk, user=operator)
    result = cases_enforce_timers(now=later(hours=3))
    case.refresh_from_db()
    assert (result.claims_expired, result.escalated, case.status) == (1, 1, "ESCALATED")
    assert [t for t, _ in timer_events(case)] == ["CASE_CLAIM_EXPIRED", "CASE_ESCALATED"]


def test_the_job_run_twice_writes_once(acme, operator):
    claimed, _waiting = unknown_cases(acme.worker, 2)
    case_claim(case_id=claimed.pk, user=operator)
    first = enforce_case_timers_task.apply(kwargs={}).get()
    assert first == {"claims_expired": 0, "escalated": 0}  # nothing due yet
    at = later(minutes=45)
    assert cases_enforce_timers(now=at).claims_expired == 1
    seq = list(Event.objects.filter(run_id=claimed.run_id).values_list("seq", flat=True))
    again = cases_enforce_timers(now=at)
    assert (again.claims_expired, again.escalated) == (0, 0)
    assert list(Event.objects.filter(run_id=claimed.run_id).values_list("seq", flat=True)) == seq
    call_command("enforce_case_timers")  # the command: the same job, nothing due now
    assert list(Event.objects.filter(run_id=claimed.run_id).values_list("seq", flat=True)) == seq


def test_each_tenant_has_its_own_timers(acme, outsider, operator):
    set_policy(acme.tenant, case_timers={"ack_s": 60, "escalate_s": 600})
    mine = unknown_case(acme.worker)
    theirs = unknown_case(outsider.worker)
    assert cases_enforce_timers(now=later(minutes=11)).escalated == 1
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.status, theirs.status) == ("ESCALATED", "OPEN")


def test_a_reassignment_is_a_new_claim_with_its_own_acknowledge_time(acme, operator):
    case = unknown_case(acme.worker)
    user_with("operator", acme.tenant, "pat")
    case_claim(case_id=case.pk, user=operator)
    ReconciliationCase.objects.filter(pk=case.pk).update(claimed_at=timezone.now() - timedelta(minutes=40))
    case_reassign(case_id=case.pk, user=operator, to="pat", reason="pat knows the provider")
    assert cases_enforce_timers().claims_expired == 0
    case.refresh_from_db()
    assert (case.status, case.claimed_by) == ("CLAIMED", "pat")


def test_reassigning_a_case_the_timer_escalated_keeps_the_escalation(acme, operator):
    case = unknown_case(acme.worker)
    cases_enforce_timers(now=later(hours=3))
    user_with("operator", acme.tenant, "pat")
    moved = case_reassign(case_id=case.pk, user=operator, to="pat", reason="pat owns the provider contact")
    assert (moved.status, moved.claimed_by, moved.escalated_by) == ("ESCALATED", "pat", "system:case-timers")
    assert cases_enforce_timers(now=later(hours=6)).claims_expired == 0  # an escalated case has no timer


def test_an_escalation_is_one_webhook_notification(acme, operator):
    webhook_endpoint(acme.tenant, kinds=("case_escalated",))
    by_timer, by_person = unknown_cases(acme.worker, 2)
    case_escalate(case_id=by_person.pk, user=operator, reason="provider ticket needed")
    cases_enforce_timers(now=later(hours=3))
    assert notifications_scan().created == 2
    assert notifications_scan().created == 0
    bodies = {d.dedupe_key: d.body for d in WebhookDelivery.objects.filter(kind="case_escalated")}
    assert set(bodies) == {f"escalated:{by_timer.pk}", f"escalated:{by_person.pk}"}
    timer_body = bodies[f"escalated:{by_timer.pk}"]
    assert timer_body["fenceline"]["subject"]["escalated_by"] == "system:case-timers"
    assert "unclaimed for longer than 2 h" in timer_body["text"]
