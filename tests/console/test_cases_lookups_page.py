"""The reconciliation queue and the dashboard with reconcilers at work: what a reconciler
is still looking up is apart from the people's queue, a case handed over shows the lookup
history, a person can take a case over from the reconciler, and the dashboard splits what
was settled automatically from what people settled."""

import pytest

from approvals.models import CaseStatus
from approvals.services.lookups import cases_look_up
from tests.factories import unknown_payment
from tests.helpers import Browser, sandbox_charge

pytestmark = pytest.mark.django_db


def test_the_queue_keeps_lookups_apart_and_shows_the_history_of_a_case_handed_to_people(acme, sandbox, operator):
    operator = Browser(operator)
    _, _, waiting = unknown_payment(acme.worker, "pay-waiting")
    _, _, handed = unknown_payment(acme.worker, "pay-handed")
    sandbox_charge(sandbox, "pay-handed")
    sandbox.lookup_mode = "cannot_tell"
    from approvals.models import ReconciliationCase

    ReconciliationCase.objects.filter(pk=waiting.pk).update(next_lookup_at="2999-01-01T00:00:00Z")
    assert cases_look_up().to_people == 1

    people = operator.get("/cases/").content.decode()
    lookups = operator.get("/cases/?status=LOOKUP").content.decode()

    assert f"case-{handed.pk}" in people and f"case-{waiting.pk}" not in people
    assert "CANNOT_TELL" in people and "reconciler:sandbox-payments" in people
    assert "GET /v1/charges?idempotency_key=pay-handed" in people
    assert f"case-{waiting.pk}" in lookups and "Take over" in lookups and "looking up" in lookups


def test_an_operator_takes_a_case_over_from_the_reconciler(acme, sandbox, operator):
    operator = Browser(operator)
    _, _, case = unknown_payment(acme.worker, "pay-take-over")

    answer = operator.post(f"/cases/{case.pk}/claim?status=LOOKUP")

    assert answer.status_code in (200, 302)
    case.refresh_from_db()
    assert case.status == CaseStatus.CLAIMED
    assert cases_look_up().claimed == 0


def test_a_viewer_cannot_take_a_case_over(acme, sandbox, viewer):
    viewer = Browser(viewer)
    _, _, case = unknown_payment(acme.worker, "pay-viewer")
    assert viewer.post(f"/cases/{case.pk}/claim").status_code == 403
    case.refresh_from_db()
    assert case.status == CaseStatus.LOOKUP


def test_the_dashboard_counts_unknowns_settled_by_reconcilers_and_by_people(acme, sandbox, operator):
    operator = Browser(operator)
    unknown_payment(acme.worker, "pay-auto")
    sandbox_charge(sandbox, "pay-auto")
    assert cases_look_up().happened == 1
    unknown_payment(acme.worker, "pay-still")  # due now too, but looked up only at the next pass
    from approvals.models import ReconciliationCase

    ReconciliationCase.objects.filter(status="LOOKUP").update(next_lookup_at="2999-01-01T00:00:00Z")

    page = operator.get("/").content.decode()

    assert "1 / 0" in page and "by reconcilers / by people" in page
    assert "1 still being looked up" in page
    assert "time in UNKNOWN" in page


def test_a_case_a_reconciler_resolved_shows_the_providers_answer_once(acme, sandbox, operator):
    _, _, case = unknown_payment(acme.worker, "pay-said-once")
    sandbox_charge(sandbox, "pay-said-once")
    assert cases_look_up().happened == 1
    case.refresh_from_db()
    why = case.lookup_history[-1]["why"]
    body = Browser(operator).get("/cases/?status=RESOLVED").content.decode()
    assert f"case-{case.pk}" in body
    assert body.count(why) == 1, why  # in the lookup's evidence, not again beside the resolution
    assert "HAPPENED by" in body and "on the provider's answer (lookup 1, in Evidence)" in body
