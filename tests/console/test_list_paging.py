"""Every list paged one way (ledger/pagination.py, console/views/paging.py, the shared
templates/console/_pager.html): next and previous pages that stay put when rows arrive,
totals counted up to a cap ("1,000+"), a bounded page size, and the same few queries on
every page."""

import re
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals.selectors import case_queue
from ledger.models import Run
from ledger.pagination import COUNT_CAP, keyset_page
from tests.factories import bulk_runs, unknown_cases
from tests.helpers import logged_in

RUNS = reverse("runs")


def _link(body: str, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" rel="{rel}"', body)
    return unescape(found.group(1)) if found else None


def _ids(page) -> list[str]:
    return [str(row["run"].pk) for row in page.context["rows"]]


def test_keyset_pages_go_back_to_the_same_rows_after_inserts(acme):
    bulk_runs(acme.tenant, 7)
    qs = Run.objects.filter(tenant=acme.tenant)
    first = keyset_page(qs, order_field="created_at", cursor=None, size=3, descending=True)
    second = keyset_page(qs, order_field="created_at", cursor=first.next_cursor, size=3, descending=True)
    third = keyset_page(qs, order_field="created_at", cursor=second.next_cursor, size=3, descending=True)
    assert [len(p.rows) for p in (first, second, third)] == [3, 3, 1]
    assert first.prev_cursor is None and third.next_cursor is None

    bulk_runs(acme.tenant, 2, start=timezone.now())  # newer runs arrive at the top while the reader is on page three

    back = keyset_page(qs, order_field="created_at", cursor=None, back=third.prev_cursor, size=3, descending=True)
    assert back.rows == second.rows and back.next_cursor == second.next_cursor
    back = keyset_page(qs, order_field="created_at", cursor=None, back=back.prev_cursor, size=3, descending=True)
    assert back.rows == first.rows
    assert back.prev_cursor is not None  # the two new runs are a page before it now
    top = keyset_page(qs, order_field="created_at", cursor=None, back=back.prev_cursor, size=3, descending=True)
    assert len(top.rows) == 2 and top.prev_cursor is None and top.next_cursor is not None


def test_the_runs_list_pages_forward_and_back_through_its_links(viewer_client, acme):
    bulk_runs(acme.tenant, 31)
    page = viewer_client.get(RUNS, {"size": "25"})
    body = page.content.decode()
    assert _link(body, "prev") is None and "First page" not in body
    following = viewer_client.get(RUNS + _link(body, "next"))
    body = following.content.decode()
    assert following.status_code == 200 and len(_ids(following)) == 6 and "Page 2" in body
    assert "size=25" in _link(body, "prev")
    previous = viewer_client.get(RUNS + _link(body, "prev"))
    assert _ids(previous) == _ids(page) and "Page 1" in previous.content.decode()


def test_a_page_size_that_is_not_offered_is_refused_with_a_notice(viewer_client, acme):
    bulk_runs(acme.tenant, 60)
    page = viewer_client.get(RUNS, {"size": "100000"})
    assert page.status_code == 200
    assert "There is no page size" in page.content.decode() and len(_ids(page)) == 50
    assert len(_ids(viewer_client.get(RUNS, {"size": "100"}))) == 60


@pytest.mark.parametrize("count, shown", [(COUNT_CAP, "1,000 runs"), (COUNT_CAP + 1, "1,000+ runs")])
def test_the_total_is_counted_up_to_the_cap(viewer_client, acme, count, shown):
    bulk_runs(acme.tenant, count)
    body = viewer_client.get(RUNS).content.decode()
    assert shown in body


def test_the_count_is_one_query_over_a_limited_subquery(viewer_client, acme):
    bulk_runs(acme.tenant, 3)
    with CaptureQueriesContext(connection) as captured:
        viewer_client.get(RUNS)
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper() and "ledger_run" in q["sql"]]
    assert counts and all(f"LIMIT {COUNT_CAP + 1}" in sql for sql in counts)


def test_every_page_costs_the_same_queries(viewer_client, acme):
    bulk_runs(acme.tenant, 60)
    with CaptureQueriesContext(connection) as first:
        page = viewer_client.get(RUNS, {"size": "25"})
    with CaptureQueriesContext(connection) as second:
        following = viewer_client.get(RUNS + _link(page.content.decode(), "next"))
    with CaptureQueriesContext(connection) as third:
        viewer_client.get(RUNS + _link(following.content.decode(), "prev"))
    assert len(first) == len(second) == len(third)


def test_the_cases_queue_pages_back_and_shows_its_total(acme, operator):
    unknown_cases(acme.worker, 3)
    page = case_queue(user=operator, size=2)
    assert page.total == 3 and not page.capped and page.next_cursor
    later = case_queue(user=operator, cursor=page.next_cursor, size=2)
    assert len(later.rows) == 1 and later.prev_cursor
    assert case_queue(user=operator, back=later.prev_cursor, size=2).rows == page.rows
    body = logged_in(operator).get(reverse("cases")).content.decode()
    assert "3 cases" in body and "Per page" in body


@pytest.mark.parametrize("name", ["approvals", "credentials", "cases", "runs"])
def test_every_list_has_the_shared_footer_and_saved_views(admin, name):
    body = logged_in(admin).get(reverse(name)).content.decode()
    assert 'aria-label="Pages"' in body and "Per page" in body and "Save this view" in body
