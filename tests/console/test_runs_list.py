"""The runs list: visible only in tenants where the user has a role; search, status and
indicator filters; keyset pages; a constant number of queries per page."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.models import Run
from ledger.services.fence import leases, runs
from tests.factories import bulk_runs, dispatched_operation, leased_run, new_run
from tests.helpers import logged_in

URL = reverse("runs")


def test_without_a_role_the_list_shows_nothing_of_the_tenant(roleless_client, acme):
    run = new_run(acme.worker)
    page = roleless_client.get(URL)
    assert page.status_code == 200
    assert str(run.pk)[:8] not in page.content.decode()
    assert "No runs match" in page.content.decode()


def test_a_viewer_sees_the_runs_of_their_tenant_with_four_badges(viewer_client, acme):
    run = new_run(acme.worker)
    page = viewer_client.get(URL)
    body = page.content.decode()
    assert page.status_code == 200
    assert reverse("run_detail", args=[run.pk]) in body
    for label in (
        "completeness</span> COMPLETE",
        "integrity</span> UNSEALED",
        "authorization</span> OK",
        "certainty</span> CERTAIN",
    ):
        assert label in body


def test_another_tenants_runs_are_not_listed(viewer_client, outsider_viewer_client, acme, outsider):
    mine, theirs = new_run(acme.worker), new_run(outsider.worker)
    body = viewer_client.get(URL).content.decode()
    assert reverse("run_detail", args=[mine.pk]) in body
    assert reverse("run_detail", args=[theirs.pk]) not in body
    assert reverse("run_detail", args=[mine.pk]) not in outsider_viewer_client.get(URL).content.decode()


def test_signed_out_users_are_sent_to_sign_in(client):
    assert client.get(URL).status_code == 302


def listed(client, **params) -> set[str]:
    page = client.get(URL, params)
    assert page.status_code == 200
    return {str(row["run"].pk) for row in page.context["rows"]}


def test_search_finds_a_run_by_id_external_id_worker_owner_and_tool(viewer_client, acme):
    run, token = leased_run(acme.worker, owner="owner-zed")
    dispatched_operation(acme.worker, run, token, "k-1")  # tool "email"
    tagged, _ = runs.run_create(worker=acme.worker, schema_version=1, external_id="ticket-4711")
    other = new_run(acme.worker)
    assert listed(viewer_client, q=str(run.pk)) == {str(run.pk)}
    assert listed(viewer_client, q="4711") == {str(tagged.pk)}
    assert listed(viewer_client, q="owner-zed") == {str(run.pk)}
    assert listed(viewer_client, q="worker-1") == {str(run.pk)}
    assert listed(viewer_client, q="EMAIL") == {str(run.pk)}
    assert str(other.pk) in listed(viewer_client)
    assert listed(viewer_client, q="no-such-thing") == set()


def test_search_never_reaches_into_another_tenant(viewer_client, outsider):
    theirs, _ = runs.run_create(worker=outsider.worker, schema_version=1, external_id="shared-name")
    assert listed(viewer_client, q="shared-name") == set()
    assert listed(viewer_client, q=str(theirs.pk)) == set()


def test_status_filter(viewer_client, acme):
    run, token = leased_run(acme.worker)
    runs.run_complete(worker=acme.worker, run_id=run.pk, fencing_token=token)
    active = new_run(acme.worker)
    assert listed(viewer_client, status="COMPLETED") == {str(run.pk)}
    assert listed(viewer_client, status="ACTIVE") == {str(active.pk)}


# Each indicator value, produced by the run's stored columns (what the transitions and the
# verifier write), must be found by its filter and only by it.
STATES = {
    "gap": {"broken_reason": "gap", "broken_first_seq": 2, "broken_last_seq": 3, "broken_detail": "missing"},
    "mutated": {"broken_reason": "mutated", "broken_first_seq": 1, "broken_last_seq": 1, "broken_detail": "hash"},
    "verified": {"verified_checkpoint_seq": 1},
    "sealed_behind": {"verified_checkpoint_seq": 1, "last_seq": 4},
    "unknown": {"n_unknown": 1},
    "in_flight": {"n_dispatched": 1},
    "completed_open": {"status": "COMPLETED", "n_unknown": 1},
    "completed_clean": {"status": "COMPLETED", "n_confirmed": 2, "verified_checkpoint_seq": 1},
    "mismatch": {"authorization_mismatches": 1, "authorization_detail": "credential revoked before dispatch"},
}

EXPECTED = [
    ("integrity", "BROKEN", {"gap", "mutated"}),
    ("integrity", "VERIFIED", {"verified", "completed_clean", "mismatch_verified"}),
    ("integrity", "UNSEALED", set(STATES) - {"gap", "mutated", "verified", "completed_clean"}),
    ("completeness", "INCOMPLETE", {"gap", "completed_open"}),
    ("completeness", "COMPLETE", set(STATES) - {"gap", "completed_open"}),
    ("certainty", "UNCERTAIN", {"unknown", "in_flight", "completed_open"}),
    ("certainty", "CERTAIN", set(STATES) - {"unknown", "in_flight", "completed_open"}),
    ("authorization", "MISMATCH", {"mismatch"}),
    ("authorization", "OK", set(STATES) - {"mismatch"}),
]


@pytest.mark.parametrize(("indicator", "value", "names"), EXPECTED, ids=[f"{i}-{v}" for i, v, _ in EXPECTED])
def test_each_indicator_filter_matches_what_the_badge_says(viewer_client, acme, indicator, value, names):
    from ledger.selectors import run_indicators

    by_name = {}
    for name, fields in STATES.items():
        run = new_run(acme.worker)  # last_seq 1 (RUN_CREATED)
        Run.objects.filter(pk=run.pk).update(**fields)
        by_name[name] = str(run.pk)
    names = names - {"mismatch_verified"}
    found = listed(viewer_client, **{indicator: value})
    assert found == {by_name[n] for n in names}
    for run in Run.objects.filter(pk__in=found):
        assert run_indicators(run)[indicator]["value"] == value


def test_filters_combine_and_an_unknown_value_is_ignored(viewer_client, acme):
    broken, fine = new_run(acme.worker), new_run(acme.worker)
    Run.objects.filter(pk=broken.pk).update(broken_reason="mutated", n_unknown=1)
    assert listed(viewer_client, integrity="BROKEN", certainty="UNCERTAIN") == {str(broken.pk)}
    assert listed(viewer_client, integrity="BROKEN", certainty="CERTAIN") == set()
    assert listed(viewer_client, integrity="PURPLE") == {str(broken.pk), str(fine.pk)}


def test_keyset_pages_cover_every_run_once_newest_first(viewer_client, acme):
    made = bulk_runs(acme.tenant, 120)
    # Three runs sharing one created_at: the id breaks the tie.
    Run.objects.filter(pk__in=[r.pk for r in made[60:63]]).update(created_at=made[60].created_at)
    seen, cursor, pages = [], "", 0
    while True:
        page = viewer_client.get(URL, {"before": cursor} if cursor else {})
        seen += [str(row["run"].pk) for row in page.context["rows"]]
        pages += 1
        cursor = page.context["next_cursor"]
        if not cursor:
            break
        assert "Next page" in page.content.decode()
    assert pages == 3
    assert len(seen) == len(set(seen)) == 120
    expected = Run.objects.filter(tenant=acme.tenant).order_by("-created_at", "-id").values_list("pk", flat=True)
    assert seen == [str(pk) for pk in expected]


def test_pagination_keeps_the_filters(viewer_client, acme):
    made = bulk_runs(acme.tenant, 60, broken_reason="mutated")
    bulk_runs(acme.tenant, 5)
    first = viewer_client.get(URL, {"integrity": "BROKEN"})
    assert len(first.context["rows"]) == 50
    assert "integrity=BROKEN&amp;before=" in first.content.decode()
    second = viewer_client.get(URL, {"integrity": "BROKEN", "before": first.context["next_cursor"]})
    assert len(second.context["rows"]) == 10 and second.context["next_cursor"] is None
    assert {str(r["run"].pk) for r in first.context["rows"] + second.context["rows"]} == {str(r.pk) for r in made}


def test_a_malformed_cursor_shows_the_first_page(viewer_client, acme):
    bulk_runs(acme.tenant, 3)
    assert len(viewer_client.get(URL, {"before": "nonsense_x"}).context["rows"]) == 3


def test_an_htmx_request_gets_only_the_table_partial(viewer_client, acme):
    run = new_run(acme.worker)
    page = viewer_client.get(URL, headers={"HX-Request": "true"})
    body = page.content.decode()
    assert body.lstrip().startswith('<div id="runs-table"')
    assert "<html" not in body and reverse("run_detail", args=[run.pk]) in body


def test_an_htmx_history_restore_gets_the_whole_page(viewer_client, acme):
    page = viewer_client.get(URL, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert "<html" in page.content.decode()
    assert "HX-Request" in page.headers["Vary"]


def count_queries(client, **params) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(URL, params).status_code == 200
    return len(ctx.captured_queries)


def test_the_number_of_queries_does_not_grow_with_the_rows(viewer, acme):
    client = logged_in(viewer)
    run, _ = leased_run(acme.worker)
    leases.lease_renew(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=1, ttl_s=30)
    bulk_runs(acme.tenant, 9)
    few = count_queries(client)
    few_search = count_queries(client, q="worker-1", certainty="CERTAIN")
    bulk_runs(acme.tenant, 190)
    assert count_queries(client) == few
    assert count_queries(client, q="worker-1", certainty="CERTAIN") == few_search
