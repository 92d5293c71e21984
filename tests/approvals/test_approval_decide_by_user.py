"""approval_decide called with a console user re-checks the APPROVE role on the request's
tenant and records the user's name; the existing decided_by= callers keep working."""

import pytest

from approvals.services.approvals import approval_decide
from ledger.errors import Forbidden
from ledger.models import Event
from tests.factories import pending_approvals
from tests.helpers import snapshot


@pytest.mark.parametrize("role", ["viewer", "operator", None])
def test_the_service_refuses_a_user_without_the_approver_role(acme, people, role):
    (approval,) = pending_approvals(acme.worker)
    person = people[role]
    before = snapshot()
    with pytest.raises(Forbidden):
        approval_decide(approval_id=approval.pk, approve=True, user=person, reason="fine")
    assert snapshot() == before


def test_an_approver_of_another_tenant_is_refused_by_the_service(acme, outsider, approver):
    (approval,) = pending_approvals(outsider.worker)
    with pytest.raises(Forbidden):
        approval_decide(approval_id=approval.pk, approve=True, user=approver, reason="fine")


def test_the_users_name_is_the_actor(acme, admin):
    (approval,) = pending_approvals(acme.worker)
    decided = approval_decide(approval_id=approval.pk, approve=False, user=admin, reason="dup")
    assert (decided.status, decided.decided_by) == ("DENIED", "ada")
    event = Event.objects.get(run_id=approval.run_id, type="APPROVAL_DENIED")
    assert (event.actor, event.fields["reason"]) == ("user:ada", "dup")
