"""The reconciliation queue page: what a viewer, an operator and an outsider see; the live
partial; htmx actions with one toast; bulk resolve previews exactly the cases it touches;
form errors; keyset pages at a constant number of queries."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals.models import ReconciliationCase
from approvals.services.cases import case_resolve
from ledger.errors import StaleToken
from ledger.models import Event
from ledger.services.fence import leases, outcomes
from tests.factories import dispatched_operation, expire, leased_run, unknown_case, unknown_cases, user_with
from tests.helpers import Browser, snapshot

URL = reverse("cases")


def fenced_late_report(worker) -> ReconciliationCase:
    """A takeover made the first owner's effect UNKNOWN; its late report is kept as
    unverified evidence on the case."""
    run, token = leased_run(worker, owner="worker-a")
    op = dispatched_operation(worker, run, token, "email:welcome:42")
    expire(run)
    leases.lease_acquire(worker=worker, run_id=run.pk, owner_id="worker-b", ttl_s=30)
    with pytest.raises(StaleToken):
        outcomes.operation_report_outcome(
            worker=worker, operation_id=op.pk, fencing_token=token, outcome="CONFIRMED", provider_request_id="msg-0042"
        )
    return ReconciliationCase.objects.get(operation=op)


# --- the three permission tests ------------------------------------------------------------


def test_without_a_role_the_queue_shows_no_case_of_the_tenant(acme):
    case = unknown_case(acme.worker)
    page = Browser(user_with(None, acme.tenant)).get(URL)
    assert page.status_code == 200
    assert case.operation.idempotency_key not in page.content.decode()
    assert "No cases here." in page.content.decode()


def test_a_viewer_sees_everything_known_about_a_case_but_no_action(acme, viewer):
    case = fenced_late_report(acme.worker)
    body = Browser(viewer).get(URL).content.decode()
    for known in (
        "email:welcome:42",  # idempotency key
        "email · send",  # tool and action
        "mailto:x@example.com",  # resource
        "msg-0042",  # the fenced worker's report, as unverified evidence
        "unverified",
        "LEASE_LOST",  # why it became UNKNOWN
        "worker-a",  # who owned the lease at dispatch
        str(case.run_id)[:8],
    ):
        assert known in body, known
    assert reverse("case-claim", args=[case.pk]) not in body
    assert reverse("case-resolve", args=[case.pk]) not in body
    assert 'id="bulk-form"' not in body


def test_an_operator_sees_the_actions(acme, operator):
    case = unknown_case(acme.worker)
    body = Browser(operator).get(URL).content.decode()
    for url in (
        reverse("case-claim", args=[case.pk]),
        reverse("case-resolve", args=[case.pk]),
        reverse("case-escalate", args=[case.pk]),
    ):
        assert url in body
    assert 'id="bulk-form"' in body


def test_another_tenants_cases_are_not_listed_and_their_actions_are_404(acme, outsider, operator):
    theirs = unknown_case(outsider.worker)
    operator = Browser(operator)
    assert theirs.operation.idempotency_key not in operator.get(URL).content.decode()
    before = snapshot()
    assert operator.post(reverse("case-claim", args=[theirs.pk])).status_code == 404
    assert snapshot() == before


# --- live updates and htmx actions ---------------------------------------------------------


def test_the_table_is_a_partial_polled_every_ten_seconds(acme, viewer):
    unknown_case(acme.worker)
    browser = Browser(viewer)
    full = browser.get(URL).content.decode()
    assert 'hx-trigger="every 10s' in full
    partial = browser.get(URL, headers={"HX-Request": "true", "HX-Target": "cases-table"}).content.decode()
    assert partial.lstrip().startswith('<div id="cases-table"')
    assert "<html" not in partial


def test_an_htmx_claim_returns_the_table_and_one_toast(acme, operator):
    case = unknown_case(acme.worker)
    browser = Browser(operator)
    response = browser.post(
        reverse("case-claim", args=[case.pk]), headers={"HX-Request": "true", "HX-Target": "cases-table"}
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.count('hx-swap-oob="beforeend:#toasts"') == 1
    assert "claimed" in body and "by olga" in body
    case.refresh_from_db()
    assert (case.status, case.claimed_by) == ("CLAIMED", "olga")
    claimed = Event.objects.get(run_id=case.run_id, type="CASE_CLAIMED")
    assert claimed.actor == "user:olga" and claimed.fields["case_id"] == str(case.pk)


def test_a_claimed_case_cannot_be_claimed_twice(acme, operator):
    case = unknown_case(acme.worker)
    first = Browser(operator)
    second = Browser(user_with("operator", acme.tenant, name="oscar"))
    assert first.post(reverse("case-claim", args=[case.pk])).status_code == 302
    before = snapshot()
    refused = second.post(reverse("case-claim", args=[case.pk]))
    assert refused.status_code == 409
    assert snapshot() == before


# --- forms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, message",
    [
        ({"resolution": "HAPPENED", "reason": "seen in the provider console"}, "provider&#x27;s request id"),
        ({"resolution": "DID_NOT_HAPPEN", "reason": ""}, "reason: This field is required."),
        ({"resolution": "MAYBE", "reason": "a guess"}, "resolution: Select a valid choice."),
    ],
)
def test_a_resolution_without_its_evidence_or_reason_is_refused_and_changes_nothing(acme, data, message, operator):
    case = unknown_case(acme.worker)
    browser = Browser(operator)
    before = snapshot()
    response = browser.post(reverse("case-resolve", args=[case.pk]), data)
    assert response.status_code == 422
    assert message in response.content.decode()
    assert snapshot() == before


def test_happened_with_the_provider_id_reconciles_the_operation(acme, operator):
    case = unknown_case(acme.worker)
    browser = Browser(operator)
    data = {"resolution": "HAPPENED", "provider_request_id": "gh-issue-991", "reason": "lookup by key found it"}
    assert browser.post(reverse("case-resolve", args=[case.pk]), data).status_code == 302
    case.refresh_from_db()
    assert (case.status, case.resolution, case.resolved_by) == ("RESOLVED", "HAPPENED", "olga")
    event = Event.objects.get(run_id=case.run_id, type="OPERATION_RECONCILED")
    assert (event.actor, event.fields["reason"], event.fields["provider_request_id"]) == (
        "user:olga",
        "lookup by key found it",
        "gh-issue-991",
    )


# --- bulk ----------------------------------------------------------------------------------


def test_bulk_preview_lists_exactly_the_selected_open_cases_and_changes_nothing(acme, operator):
    cases = unknown_cases(acme.worker, 5)
    chosen, others = cases[:3], cases[3:]
    case_resolve(case_id=chosen[2].pk, resolved_by="someone", resolution="DID_NOT_HAPPEN", reason="already handled")
    browser = Browser(operator)
    data = {
        "case": [str(c.pk) for c in chosen],
        "resolution": "DID_NOT_HAPPEN",
        "reason": "provider outage, nothing sent",
    }
    before = snapshot()
    preview = browser.post(reverse("cases-bulk"), data, headers={"HX-Request": "true"})
    body = preview.content.decode()
    assert preview.status_code == 200
    assert snapshot() == before
    will_touch = [c for c in chosen if f'name="case" value="{c.pk}"' in body]
    assert will_touch == chosen[:2]
    assert all(str(c.pk) not in body for c in others)
    assert "2 cases will be resolved" in body and "1 selected case is no longer open" in body

    confirm = {
        "case": [str(c.pk) for c in will_touch],
        "resolution": "DID_NOT_HAPPEN",
        "reason": data["reason"],
        "confirm": "1",
    }
    assert browser.post(reverse("cases-bulk"), confirm).status_code == 302
    statuses = dict(ReconciliationCase.objects.values_list("pk", "status"))
    assert [statuses[c.pk] for c in cases] == ["RESOLVED", "RESOLVED", "RESOLVED", "OPEN", "OPEN"]
    resolved_by_olga = Event.objects.filter(type="OPERATION_RECONCILED", actor="user:olga")
    assert resolved_by_olga.count() == 2
    assert {e.fields["case_id"] for e in resolved_by_olga} == {str(c.pk) for c in will_touch}


def test_bulk_confirm_is_all_or_none(acme, operator):
    cases = unknown_cases(acme.worker, 3)
    case_resolve(case_id=cases[1].pk, resolved_by="someone", resolution="COMPENSATED", reason="refunded")
    browser = Browser(operator)
    before = snapshot()
    confirm = {
        "case": [str(c.pk) for c in cases],
        "resolution": "COMPENSATED",
        "reason": "refunded all",
        "confirm": "1",
    }
    response = browser.post(reverse("cases-bulk"), confirm)
    assert response.status_code == 409
    assert "Nothing changed" in response.content.decode()
    assert snapshot() == before


def test_bulk_cannot_mark_cases_as_happened(acme, operator):
    cases = unknown_cases(acme.worker, 2)
    browser = Browser(operator)
    before = snapshot()
    data = {"case": [str(c.pk) for c in cases], "resolution": "HAPPENED", "reason": "sure", "confirm": "1"}
    assert browser.post(reverse("cases-bulk"), data).status_code == 422
    assert snapshot() == before


# --- pages ---------------------------------------------------------------------------------


def queries_for(browser, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert browser.get(url).status_code == 200
    return len(captured)


def test_the_page_costs_the_same_queries_with_10_and_200_cases(acme, operator):
    browser = Browser(operator)
    unknown_cases(acme.worker, 10, prefix="a")
    browser.get(URL)  # the process's caches (content types) warm, as after any first request
    with_10 = queries_for(browser, URL)
    unknown_cases(acme.worker, 190, prefix="b")
    with_200 = queries_for(browser, URL)
    assert with_10 == with_200


def test_keyset_pages_cover_every_case_once(acme, viewer):
    cases = unknown_cases(acme.worker, 120)
    browser = Browser(viewer)
    seen, url = [], URL
    while url:
        page = browser.get(url)
        assert page.status_code == 200
        rows = page.context["rows"]
        seen.extend(c.pk for c in rows)
        cursor = page.context["next_cursor"]
        url = f"{URL}?status=open&after={cursor}" if cursor else None
    assert seen == [c.pk for c in cases]


def test_an_escalated_case_shows_who_escalated_it_and_why(acme, operator):
    case = unknown_case(acme.worker)
    browser = Browser(operator)
    assert (
        browser.post(reverse("case-escalate", args=[case.pk]), {"reason": "provider support ticket 4411"}).status_code
        == 302
    )
    case.refresh_from_db()
    assert (case.status, case.escalated_by, case.escalation_reason) == (
        "ESCALATED",
        "olga",
        "provider support ticket 4411",
    )
    body = browser.get(URL + "?status=ESCALATED").content.decode()
    assert "escalated by olga: provider support ticket 4411" in body
