"""Case groups on the reconciliation page: similar cases waiting for people grouped by
tenant, tool, provider, reason and reconciler verdict with a count and age range; a group's
actions (claim, resolve, escalate all) go through the one bulk path, first showing exactly
the cases they will touch; an operator acts, a viewer sees the group and no action, another
tenant's group is a 404. Every case row shows its age and its timer."""

import pytest
from django.db import connection
from django.urls import reverse

from approvals.models import ReconciliationCase
from approvals.selectors import case_groups, group_case_ids
from approvals.services.cases import case_claim, cases_claim_bulk, cases_escalate_bulk
from ledger.errors import WrongPhase
from ledger.models import Event
from tests.factories import unknown_case, unknown_cases
from tests.helpers import Browser, snapshot

URL = reverse("cases")
BULK = reverse("cases-bulk")


def group_fields(case: ReconciliationCase) -> dict[str, str]:
    return {
        "group_tenant": str(case.tenant_id),
        "group_tool": case.tool,
        "group_provider": case.provider,
        "group_reason": case.reason,
        "group_verdict": case.verdict,
    }


def test_similar_cases_form_one_group_with_a_count_and_age_range(acme, outsider, viewer):
    similar = unknown_cases(acme.worker, 3)
    lone = unknown_case(acme.worker)  # another reason (the provider timed out): a group of one
    unknown_cases(outsider.worker, 2)  # another tenant's: not seen
    found = case_groups(user=viewer)
    assert not found["capped"]
    (group,) = found["groups"]
    assert (group["n"], group["tenant_slug"], group["tool"], group["reason"]) == (3, "acme", "email", similar[0].reason)
    assert lone.reason != similar[0].reason
    assert (group["oldest"], group["newest"]) == (similar[0].opened_at, similar[-1].opened_at)
    assert sorted(group_case_ids(user=viewer, key=group)) == sorted(str(c.pk) for c in similar)


def test_a_viewer_sees_the_groups_and_no_action(acme, viewer):
    unknown_cases(acme.worker, 2)
    page = Browser(viewer).get(URL).content.decode()
    assert "Similar cases" in page and "Act on these 2" not in page and 'name="group_tenant"' not in page


def test_a_viewer_posting_a_group_action_is_refused_and_nothing_changes(acme, viewer):
    cases = unknown_cases(acme.worker, 2)
    before = snapshot()
    answer = Browser(viewer).post(BULK, {**group_fields(cases[0]), "action": "claim", "confirm": "1"})
    assert answer.status_code == 403
    assert snapshot() == before


def test_another_tenants_group_is_a_404(acme, outsider, operator):
    theirs = unknown_cases(outsider.worker, 2)
    before = snapshot()
    answer = Browser(operator).post(BULK, {**group_fields(theirs[0]), "action": "claim"})
    assert answer.status_code == 404
    assert snapshot() == before


def test_an_operator_previews_a_group_claim_then_claims_exactly_those(acme, operator):
    cases = unknown_cases(acme.worker, 3)
    browser = Browser(operator)
    assert "Act on these 3" in browser.get(URL).content.decode()
    before = snapshot()
    preview = browser.post(BULK, {**group_fields(cases[0]), "action": "claim"}, headers={"HX-Request": "true"})
    body = preview.content.decode()
    assert preview.status_code == 200 and snapshot() == before
    assert "Group claim: 3 cases will be claimed by you" in body
    assert [c for c in cases if f'name="case" value="{c.pk}"' in body] == cases
    confirmed = browser.post(BULK, {"case": [str(c.pk) for c in cases], "action": "claim", "confirm": "1"})
    assert confirmed.status_code == 302
    assert set(ReconciliationCase.objects.filter(pk__in=[c.pk for c in cases]).values_list("status", "claimed_by")) == {
        ("CLAIMED", "olga")
    }


def test_a_group_resolve_uses_one_verdict_and_evidence_for_all(acme, operator):
    cases = unknown_cases(acme.worker, 2)
    browser = Browser(operator)
    fields = {**group_fields(cases[0]), "action": "resolve", "resolution": "DID_NOT_HAPPEN", "reason": "outage"}
    body = browser.post(BULK, fields, headers={"HX-Request": "true"}).content.decode()
    assert "Group resolve: 2 cases will be resolved as DID_NOT_HAPPEN" in body and "Reason: outage" in body
    ids = [str(c.pk) for c in cases]
    browser.post(
        BULK, {"case": ids, "action": "resolve", "resolution": "DID_NOT_HAPPEN", "reason": "outage", "confirm": "1"}
    )
    assert set(ReconciliationCase.objects.filter(pk__in=ids).values_list("status", "resolution_reason")) == {
        ("RESOLVED", "outage")
    }


def test_a_group_escalate_needs_a_reason_and_then_escalates_all(acme, operator):
    cases = unknown_cases(acme.worker, 2)
    browser = Browser(operator)
    before = snapshot()
    refused = browser.post(BULK, {**group_fields(cases[0]), "action": "escalate"})
    assert refused.status_code == 422 and snapshot() == before
    ids = [str(c.pk) for c in cases]
    browser.post(BULK, {"case": ids, "action": "escalate", "reason": "provider down", "confirm": "1"})
    assert set(ReconciliationCase.objects.filter(pk__in=ids).values_list("status", "escalated_by")) == {
        ("ESCALATED", "olga")
    }


def test_bulk_claim_and_escalate_are_all_or_none(acme, operator):
    cases = unknown_cases(acme.worker, 3)
    case_claim(case_id=cases[1].pk, user=operator)
    before = snapshot()
    with pytest.raises(WrongPhase):
        cases_claim_bulk(case_ids=[c.pk for c in cases], user=operator)
    assert snapshot() == before
    done = cases_escalate_bulk(case_ids=[c.pk for c in cases], user=operator, reason="provider down")
    assert [c.status for c in done] == ["ESCALATED"] * 3
    assert Event.objects.filter(run_id=cases[0].run_id, type="CASE_ESCALATED").count() == 3


def test_every_open_case_row_shows_its_age_and_time_left(acme, operator):
    _waiting, held = unknown_cases(acme.worker, 2)
    case_claim(case_id=held.pk, user=operator)
    page = Browser(operator).get(URL).content.decode()
    assert page.count('data-label="timer"') == 2
    assert "escalates <time" in page and "claim expires <time" in page
    assert page.count('data-rel="age"') >= 2


def test_the_group_action_query_walks_the_group_index(acme, viewer):
    cases = unknown_cases(acme.worker, 2)
    key = {k: getattr(cases[0], k) for k in ("tenant_id", "tool", "provider", "reason", "verdict")}
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        qs = ReconciliationCase.objects.filter(status__in=("OPEN", "CLAIMED", "ESCALATED"), **key).order_by(
            "opened_at", "id"
        )
        plan = qs.explain()
    assert "case_group" in plan
