"""Triage at fleet scale (issue 17): the cases queue's "mine", "unclaimed" and "all" views,
unclaim and reassign with a reason, a comment thread through the secret boundary; approvals
by any status and decided in bulk after a preview; filters whose unknown values say so;
the runs list's prefix search, filters, order and totals."""

from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest, CaseComment
from approvals.services.cases import case_claim, case_resolve
from ledger.models import Event
from tests.factories import (
    bulk_runs,
    dispatched_operation,
    leased_run,
    new_run,
    pending_approvals,
    unknown_cases,
    user_with,
)
from tests.helpers import Browser, snapshot

CASES = reverse("cases")
APPROVALS = reverse("approvals")
RUNS = reverse("runs")


def shown(page, prefix="case-") -> list[str]:
    body = page.content.decode()
    return [chunk.split('"')[0] for chunk in body.split(f'id="{prefix}')[1:]]


# --- cases: the views of the queue -----------------------------------------------------------


def test_mine_unclaimed_and_all_show_exactly_their_cases(acme, operator):
    first, second, third = unknown_cases(acme.worker, 3)
    pat = user_with("operator", acme.tenant, "pat")
    case_claim(case_id=first.pk, user=operator)
    case_claim(case_id=second.pk, user=pat)
    case_resolve(case_id=third.pk, user=pat, resolution="DID_NOT_HAPPEN", reason="never sent")
    as_olga = Browser(operator)
    assert shown(as_olga.get(CASES, {"status": "mine"})) == [str(first.pk)]
    assert shown(as_olga.get(CASES, {"status": "unclaimed"})) == []
    everything = as_olga.get(CASES, {"status": "all"})
    assert set(shown(everything)) == {str(first.pk), str(second.pk), str(third.pk)}
    body = everything.content.decode()
    assert 'class="resolved-by">pat</span>' in body and "never sent" in body


def test_status_values_match_in_any_case_and_an_unknown_one_says_so(acme, operator, viewer):
    (case,) = unknown_cases(acme.worker, 1)
    case_resolve(case_id=case.pk, user=operator, resolution="COMPENSATED", reason="r")
    browser = Browser(viewer)
    resolved = browser.get(CASES, {"status": "resolved"})  # it showed every open case before
    assert shown(resolved) == [str(case.pk)] and "There is no status" not in resolved.content.decode()
    odd = browser.get(CASES, {"status": "closed-ish"}).content.decode()
    assert "There is no status “closed-ish”: showing open instead." in odd
    assert "There is no sort" in browser.get(CASES, {"sort": "sideways"}).content.decode()


def test_the_queue_orders_by_how_long_a_case_has_waited(acme, viewer):
    cases = unknown_cases(acme.worker, 3)
    browser = Browser(viewer)
    oldest_first = shown(browser.get(CASES, {"sort": "oldest"}))
    assert oldest_first == [str(c.pk) for c in cases]
    assert shown(browser.get(CASES, {"sort": "newest"})) == oldest_first[::-1]


def test_nothing_selectable_means_no_bulk_panel(acme, operator):
    (case,) = unknown_cases(acme.worker, 1)
    case_resolve(case_id=case.pk, user=operator, resolution="COMPENSATED", reason="r")
    body = Browser(operator).get(CASES, {"status": "RESOLVED"}).content.decode()
    assert 'id="bulk-form"' not in body and 'name="case"' not in body


# --- cases: unclaim, reassign, comment -------------------------------------------------------


def test_an_operator_unclaims_with_a_reason_recorded_in_the_chain(acme, operator):
    (case,) = unknown_cases(acme.worker, 1)
    case_claim(case_id=case.pk, user=operator)
    answer = Browser(operator).post(reverse("case-unclaim", args=[case.pk]), {"reason": "going off shift"})
    assert answer.status_code == 302
    case.refresh_from_db()
    assert (case.status, case.claimed_by) == ("OPEN", "")
    event = Event.objects.filter(run=case.run, type="CASE_UNCLAIMED").get()
    assert (event.actor, event.fields["reason"], event.fields["claimed_by"]) == ("user:olga", "going off shift", "olga")


def test_a_case_is_reassigned_only_to_someone_who_may_work_it(acme, outsider, operator, viewer):
    (case,) = unknown_cases(acme.worker, 1)
    user_with("operator", acme.tenant, "pat")
    user_with("operator", outsider.tenant, "otto")
    browser = Browser(operator)
    for name in ("vera", "otto", "nobody-here"):
        before = snapshot()
        refused = browser.post(reverse("case-reassign", args=[case.pk]), {"to": name, "reason": "r"})
        assert refused.status_code == 422, name
        assert snapshot() == before
    assert (
        browser.post(reverse("case-reassign", args=[case.pk]), {"to": "pat", "reason": "knows stripe"}).status_code
        == 302
    )
    case.refresh_from_db()
    assert (case.status, case.claimed_by) == ("CLAIMED", "pat")
    event = Event.objects.filter(run=case.run, type="CASE_REASSIGNED").get()
    assert event.fields["to"] == "pat" and event.fields["reason"] == "knows stripe" and event.actor == "user:olga"


def test_a_comment_is_threaded_on_the_case_and_a_credential_is_refused_unstored(acme, operator):
    (case,) = unknown_cases(acme.worker, 1)
    operator = Browser(operator)
    assert (
        operator.post(reverse("case-comment", args=[case.pk]), {"text": "asked the provider, ticket 881"}).status_code
        == 302
    )
    canary = "AKIAIOSFODNN7EXAMPLE"
    before = snapshot()
    refused = operator.post(reverse("case-comment", args=[case.pk]), {"text": f"key is {canary}"})
    assert refused.status_code == 422 and canary not in refused.content.decode()
    assert snapshot() == before and not CaseComment.objects.filter(text__contains=canary).exists()
    body = operator.get(CASES).content.decode()
    assert "asked the provider, ticket 881" in body and 'class="comment-author">olga' in body
    assert Event.objects.filter(run=case.run, type="CASE_COMMENTED").count() == 1


def test_a_viewer_cannot_unclaim_reassign_or_comment(acme, viewer):
    (case,) = unknown_cases(acme.worker, 1)
    viewer = Browser(viewer)
    before = snapshot()
    for name, data in (("case-unclaim", {"reason": "r"}), ("case-reassign", {"to": "x", "reason": "r"}),
                       ("case-comment", {"text": "hi"})):  # fmt: skip
        assert viewer.post(reverse(name, args=[case.pk]), data).status_code == 403
    assert snapshot() == before


def test_another_tenants_case_is_404_for_the_new_actions(acme, outsider, operator):
    (case,) = unknown_cases(outsider.worker, 1)
    operator = Browser(operator)
    for name, data in (("case-unclaim", {"reason": "r"}), ("case-reassign", {"to": "x", "reason": "r"}),
                       ("case-comment", {"text": "hi"})):  # fmt: skip
        assert operator.post(reverse(name, args=[case.pk]), data).status_code == 404


def test_an_unknown_operation_links_to_its_case_and_the_case_to_its_operation(acme, viewer):
    (case,) = unknown_cases(acme.worker, 1)
    viewer = Browser(viewer)
    run_page = viewer.get(reverse("run_detail", args=[case.run_id])).content.decode()
    assert f"#case-{case.pk}" in run_page and f'id="op-{case.operation_id}"' in run_page
    assert f"/runs/{case.run_id}/#op-{case.operation_id}" in viewer.get(CASES).content.decode()


# --- approvals: every status, and decisions in bulk ------------------------------------------


def test_approvals_show_the_status_asked_for_in_any_case(acme, approver):
    first, second = pending_approvals(acme.worker, 2)
    approver = Browser(approver)
    assert (
        approver.post(reverse("approval-decide", args=[first.pk]), {"decision": "approve", "reason": "ok"}).status_code
        == 302
    )
    assert shown(approver.get(APPROVALS, {"status": "approved"}), "approval-") == [str(first.pk)]
    assert shown(approver.get(APPROVALS, {"status": "PENDING"}), "approval-") == [str(second.pk)]
    assert "There is no status “yes”" in approver.get(APPROVALS, {"status": "yes"}).content.decode()


def test_bulk_approve_previews_exactly_the_requests_then_decides_them_all(acme, approver):
    requests = pending_approvals(acme.worker, 3)
    approver = Browser(approver)
    chosen = [str(a.pk) for a in requests[:2]]
    before = snapshot()
    preview = approver.post(reverse("approvals-bulk"), {"approval": chosen, "decision": "approve", "reason": "batch ok"},
                            HTTP_HX_REQUEST="true")  # fmt: skip
    body = preview.content.decode()
    assert preview.status_code == 200 and "2 requests will be approved" in body
    assert all(pk in body for pk in chosen) and str(requests[2].pk) not in body
    assert snapshot() == before  # a preview changes nothing
    done = approver.post(reverse("approvals-bulk"), {"approval": chosen, "decision": "approve", "reason": "batch ok",
                                                     "confirm": "1"})  # fmt: skip
    assert done.status_code == 302
    statuses = dict(ApprovalRequest.objects.values_list("pk", "status"))
    assert [statuses[a.pk] for a in requests] == ["APPROVED", "APPROVED", "PENDING"]
    assert Event.objects.filter(type="APPROVAL_APPROVED", fields__reason="batch ok").count() == 2


def test_bulk_decisions_are_all_or_none(acme, approver):
    first, second = pending_approvals(acme.worker, 2)
    approver = Browser(approver)
    approver.post(reverse("approval-decide", args=[second.pk]), {"decision": "deny", "reason": "no"})
    before = snapshot()
    answer = approver.post(reverse("approvals-bulk"), {"approval": [str(first.pk), str(second.pk)],
                                                       "decision": "approve", "reason": "r", "confirm": "1"})  # fmt: skip
    assert answer.status_code == 409 and snapshot() == before


def test_an_operator_cannot_decide_in_bulk_and_another_tenants_request_is_404(acme, outsider, operator, approver):
    (mine,) = pending_approvals(acme.worker, 1)
    (theirs,) = pending_approvals(outsider.worker, 1, prefix="other")
    operator = Browser(operator)
    data = {"decision": "approve", "reason": "r", "confirm": "1"}
    assert operator.post(reverse("approvals-bulk"), {**data, "approval": [str(mine.pk)]}).status_code == 403
    approver = Browser(approver)
    assert approver.post(reverse("approvals-bulk"), {**data, "approval": [str(theirs.pk)]}).status_code == 404


# --- runs: search by the start of an id, filters, order, totals ------------------------------


def listed(browser, **params) -> list[str]:
    page = browser.get(RUNS, params)
    assert page.status_code == 200
    return [str(row["run"].pk) for row in page.context["rows"]]


def test_a_run_is_found_by_the_start_of_its_id_or_of_its_owner(acme, viewer):
    run, _ = leased_run(acme.worker, owner="owner-zebra-1")
    new_run(acme.worker)
    viewer = Browser(viewer)
    assert listed(viewer, q=str(run.pk)[:8]) == [str(run.pk)]
    assert listed(viewer, q=str(run.pk)[:13]) == [str(run.pk)]  # with the dash
    assert listed(viewer, q="owner-zeb") == [str(run.pk)]
    assert "run id or its first 8+ characters" in viewer.get(RUNS).content.decode()  # what is matched


def test_runs_filter_by_tenant_worker_tool_class_and_phase(acme, viewer):
    run, token = leased_run(acme.worker)
    dispatched_operation(acme.worker, run, token, "k-1", effect_class="NON_RETRYABLE")  # tool email, DISPATCHED
    quiet = new_run(acme.worker)
    viewer = Browser(viewer)
    assert listed(viewer, tool="EMAIL") == [str(run.pk)]
    assert listed(viewer, worker="WORKER-1") == [str(run.pk)]
    assert listed(viewer, **{"class": "non_retryable"}) == [str(run.pk)]
    assert listed(viewer, phase="dispatched") == [str(run.pk)]
    assert set(listed(viewer, tenant="acme")) == {str(run.pk), str(quiet.pk)}
    assert listed(viewer, phase="UNKNOWN") == []


def test_an_unknown_run_filter_value_is_a_notice_and_no_filter(acme, outsider, viewer):
    mine = new_run(acme.worker)
    viewer = Browser(viewer)
    page = viewer.get(RUNS, {"certainty": "MAYBE", "tenant": outsider.tenant.slug})
    body = page.content.decode()
    assert "There is no certainty “MAYBE”" in body and f"There is no tenant “{outsider.tenant.slug}”" in body
    assert [str(r["run"].pk) for r in page.context["rows"]] == [str(mine.pk)]
    assert listed(viewer, status="active") == [str(mine.pk)]  # any case


def test_oldest_first_and_a_total_on_every_page(acme, viewer):
    runs = bulk_runs(acme.tenant, 60)
    viewer = Browser(viewer)
    oldest = viewer.get(RUNS, {"sort": "oldest"})
    assert [str(r["run"].pk) for r in oldest.context["rows"]][:3] == [str(r.pk) for r in runs[:3]]
    body = oldest.content.decode()
    assert "Page 1 · 60 runs" in body and "Next page (2)" in body  # counted: no estimate under 1,000
    few = viewer.get(RUNS, {"q": str(runs[0].pk)[:8]}).content.decode()
    assert "Page 1 · 1 run ·" in few


# --- workers: drain many -----------------------------------------------------------------------


def test_an_admin_drains_many_workers_after_a_preview_all_or_none(acme, admin):
    from ledger.models import Worker
    from ledger.services.fleet.lifecycle import worker_change
    from ledger.services.fleet.workers import worker_create

    second, _ = worker_create(tenant=acme.tenant, name="worker-2")
    third, _ = worker_create(tenant=acme.tenant, name="worker-3")
    browser = Browser(admin)
    url = reverse("workers-drain")
    chosen = [str(acme.worker.pk), str(second.pk)]
    before = snapshot()
    preview = browser.post(url, {"worker": chosen, "reason": "deploy 42", "deadline_min": "5"}, HTTP_HX_REQUEST="true")
    body = preview.content.decode()
    assert "2 workers will drain, for at most 5 min" in body and "worker-3" not in body
    assert snapshot() == before
    worker_change(worker_id=second.pk, action="quarantine", reason="broke", user=admin)  # no longer ACCEPTING
    before = snapshot()
    refused = browser.post(url, {"worker": chosen, "reason": "deploy 42", "deadline_min": "5", "confirm": "1"})
    assert refused.status_code == 302 and snapshot() == before  # nothing changed: all or none
    done = browser.post(url, {"worker": [str(acme.worker.pk), str(third.pk)], "reason": "deploy 42", "confirm": "1"})
    assert done.status_code == 302
    assert set(Worker.objects.filter(status="DRAINING").values_list("name", flat=True)) == {"worker-1", "worker-3"}


def test_only_an_admin_drains_in_bulk_and_another_tenants_worker_is_404(acme, outsider, operator, admin):
    operator = Browser(operator)
    data = {"worker": [str(acme.worker.pk)], "reason": "r", "confirm": "1"}
    assert operator.post(reverse("workers-drain"), data).status_code == 403
    admin = Browser(admin)
    assert admin.post(reverse("workers-drain"), {**data, "worker": [str(outsider.worker.pk)]}).status_code == 404


# --- a refused form and the icon ---------------------------------------------------------------


def test_an_expired_form_answers_a_page_and_an_htmx_toast_that_change_nothing(acme, operator):
    (case,) = unknown_cases(acme.worker, 1)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    claim = reverse("case-claim", args=[case.pk])
    page = client.post(claim)
    assert page.status_code == 403
    assert "Form expired" in page.content.decode() and "Nothing was changed" in page.content.decode()
    htmx = client.post(claim, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 403 and "Nothing was changed" in htmx["X-Fenceline-Message"]
    case.refresh_from_db()
    assert case.status == "OPEN" and case.claimed_by == ""


def test_the_icon_a_browser_asks_for_exists(client):
    answer = client.get("/favicon.ico")
    assert answer.status_code == 302 and answer["Location"].endswith(".svg")
    assert client.get(answer["Location"]).status_code == 200


def test_the_credentials_list_polls_and_names_an_unknown_state(acme, viewer):
    browser = Browser(viewer)
    page = browser.get(reverse("credentials"), {"state": "Revoked"}).content.decode()
    assert 'hx-trigger="every 15s' in page and "There is no state" not in page
    odd = browser.get(reverse("credentials"), {"state": "gone"}).content.decode()
    assert "There is no state “gone”: showing active instead." in odd


def test_open_means_waiting_for_people_in_any_case_and_a_claimed_case_stays_in_it(acme, operator):
    first, second = unknown_cases(acme.worker, 2)
    client = Client()
    client.force_login(operator)
    answer = client.post(
        reverse("case-claim", args=[first.pk]) + "?status=open&sort=oldest",
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="cases-table",
    )
    assert set(shown(answer)) == {str(first.pk), str(second.pk)}  # the claimed case did not vanish
    for spelled in ("open", "OPEN", "Open"):
        assert set(shown(Browser(operator).get(CASES, {"status": spelled}))) == {str(first.pk), str(second.pk)}
    assert shown(Browser(operator).get(CASES, {"status": "unclaimed"})) == [str(second.pk)]


def test_no_two_filter_values_differ_only_in_case():
    """Filters match case-insensitively (``chosen``): "open" and "OPEN" meaning different
    things made a claimed case vanish from the queue after the claim."""
    from approvals.selectors import APPROVAL_FILTERS, APPROVAL_SORTS, CASE_FILTERS, SORTS
    from ledger import admin_selectors
    from ledger.states import EffectClass, Phase, RunStatus

    for values in (APPROVAL_FILTERS, APPROVAL_SORTS, CASE_FILTERS, SORTS, admin_selectors.LEASE_STATES):
        values = list(values)
        assert len({v.lower() for v in values}) == len(values), values
    for choices in (EffectClass, Phase, RunStatus):
        assert len({v.lower() for v in choices.values}) == len(choices.values)
