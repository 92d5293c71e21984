"""The reconciliation queue and the dashboard with reconcilers at work: what a reconciler
is still looking up is apart from the people's queue, a case handed over shows the lookup
history, a person can take a case over from the reconciler, and the dashboard splits what
was settled automatically from what people settled."""

import pytest

from approvals.models import CaseStatus
from approvals.services.lookups import cases_look_up
from tests.console.queues_fixtures import Browser, user_with
from tests.faults.test_reconcilers import charge, sandbox, unknown  # noqa: F401 - sandbox is a fixture

pytestmark = pytest.mark.django_db


def test_the_queue_keeps_lookups_apart_and_shows_the_history_of_a_case_handed_to_people(acme, sandbox):  # noqa: F811
    operator = Browser(user_with("operator", acme.tenant))
    _, _, waiting = unknown(acme.worker, "pay-waiting")
    _, _, handed = unknown(acme.worker, "pay-handed")
    charge(sandbox, "pay-handed")
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


def test_an_operator_takes_a_case_over_from_the_reconciler(acme, sandbox):  # noqa: F811
    operator = Browser(user_with("operator", acme.tenant))
    _, _, case = unknown(acme.worker, "pay-take-over")

    answer = operator.post(f"/cases/{case.pk}/claim?status=LOOKUP")

    assert answer.status_code in (200, 302)
    case.refresh_from_db()
    assert case.status == CaseStatus.CLAIMED
    assert cases_look_up().claimed == 0


def test_a_viewer_cannot_take_a_case_over(acme, sandbox):  # noqa: F811
    viewer = Browser(user_with("viewer", acme.tenant))
    _, _, case = unknown(acme.worker, "pay-viewer")
    assert viewer.post(f"/cases/{case.pk}/claim").status_code == 403
    case.refresh_from_db()
    assert case.status == CaseStatus.LOOKUP


def test_the_dashboard_counts_unknowns_settled_by_reconcilers_and_by_people(acme, sandbox):  # noqa: F811
    operator = Browser(user_with("operator", acme.tenant))
    unknown(acme.worker, "pay-auto")
    charge(sandbox, "pay-auto")
    assert cases_look_up().happened == 1
    unknown(acme.worker, "pay-still")  # due now too, but looked up only at the next pass
    from approvals.models import ReconciliationCase

    ReconciliationCase.objects.filter(status="LOOKUP").update(next_lookup_at="2999-01-01T00:00:00Z")

    page = operator.get("/").content.decode()

    assert "1 / 0" in page and "by reconcilers / by people" in page
    assert "1 still being looked up" in page
    assert "time in UNKNOWN" in page
