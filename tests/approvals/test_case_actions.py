"""Case services called with a console user: the service itself re-checks the role on the
case's tenant (whatever entry point calls it), writes one event naming the user, and the
conditional UPDATE on the status decides who wins."""

import pytest

from approvals.models import ReconciliationCase
from approvals.services.cases import (
    case_claim,
    case_escalate,
    case_reassign,
    case_resolve,
    cases_preview,
    cases_resolve_bulk,
)
from ledger.errors import Forbidden, InvalidInput, WrongPhase
from ledger.models import Event, Run
from tests.factories import unknown_case, unknown_cases, user_with
from tests.helpers import snapshot


@pytest.mark.parametrize("role", ["viewer", "approver", None])
def test_the_service_refuses_a_user_without_the_operator_role(acme, people, role):
    case = unknown_case(acme.worker)
    user = people[role]
    before = snapshot()
    with pytest.raises(Forbidden):
        case_claim(case_id=case.pk, user=user)
    with pytest.raises(Forbidden):
        case_escalate(case_id=case.pk, user=user, reason="stuck")
    with pytest.raises(Forbidden):
        case_resolve(case_id=case.pk, user=user, resolution="DID_NOT_HAPPEN", reason="nothing sent")
    with pytest.raises(Forbidden):
        cases_resolve_bulk(case_ids=[case.pk], user=user, resolution="DID_NOT_HAPPEN", reason="nothing sent")
    assert cases_preview(case_ids=[case.pk], user=user) == []
    assert snapshot() == before


def test_an_operator_of_another_tenant_is_refused_by_the_service(acme, outsider, operator):
    case = unknown_case(outsider.worker)
    with pytest.raises(Forbidden):
        case_claim(case_id=case.pk, user=operator)


def test_claim_then_escalate_each_append_exactly_one_event_naming_the_user(acme, operator):
    case = unknown_case(acme.worker)
    seq = Run.objects.get(pk=case.run_id).last_seq
    claimed = case_claim(case_id=case.pk, user=operator)
    assert (claimed.status, claimed.claimed_by) == ("CLAIMED", "olga")
    escalated = case_escalate(case_id=case.pk, user=operator, reason="provider support ticket needed")
    assert escalated.status == "ESCALATED"
    events = list(Event.objects.filter(run_id=case.run_id, seq__gt=seq).order_by("seq"))
    assert [(e.type, e.actor) for e in events] == [("CASE_CLAIMED", "user:olga"), ("CASE_ESCALATED", "user:olga")]
    assert events[1].fields["reason"] == "provider support ticket needed"
    assert Run.objects.get(pk=case.run_id).last_seq == seq + 2
    with pytest.raises(WrongPhase):
        case_claim(case_id=case.pk, user=operator)  # only an OPEN case can be claimed


def test_reassigning_an_escalated_case_keeps_it_escalated_with_its_note(acme, operator):
    case = unknown_case(acme.worker)
    user_with("operator", acme.tenant, "pat")
    case_escalate(case_id=case.pk, user=operator, reason="provider support ticket needed")
    moved = case_reassign(case_id=case.pk, user=operator, to="pat", reason="pat owns the provider contact")
    assert (moved.status, moved.claimed_by) == ("ESCALATED", "pat")
    assert (moved.escalated_by, moved.escalation_reason) == ("olga", "provider support ticket needed")
    event = Event.objects.filter(run_id=case.run_id, type="CASE_REASSIGNED").get()
    assert (event.fields["to"], event.fields["reason"]) == ("pat", "pat owns the provider contact")


def test_an_escalation_needs_a_reason(acme, operator):
    case = unknown_case(acme.worker)
    with pytest.raises(InvalidInput):
        case_escalate(case_id=case.pk, user=operator, reason="  ")


def test_bulk_resolves_all_or_none(acme, operator):
    cases = unknown_cases(acme.worker, 3)
    case_resolve(case_id=cases[0].pk, resolved_by="reconciler", resolution="COMPENSATED", reason="refunded")
    before = snapshot()
    with pytest.raises(WrongPhase):
        cases_resolve_bulk(case_ids=[c.pk for c in cases], user=operator, resolution="COMPENSATED", reason="refunded")
    assert snapshot() == before
    assert cases_preview(case_ids=[c.pk for c in cases], user=operator) == cases[1:]
    done = cases_resolve_bulk(
        case_ids=[c.pk for c in cases[1:]], user=operator, resolution="COMPENSATED", reason="refunded"
    )
    assert [c.resolved_by for c in done] == ["olga", "olga"]
    assert set(ReconciliationCase.objects.values_list("status", flat=True)) == {"RESOLVED"}
