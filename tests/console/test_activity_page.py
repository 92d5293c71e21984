"""/activity/: the feed of the tenants the user sees, filtered, live, paged; bad filters are
a form error (400) naming the field; an ended session is sent to sign in, not swapped in."""

import pytest
from django.urls import reverse

from ledger.services.core.decisions import admin_action_record
from tests.factories import new_run
from tests.helpers import logged_in

URL = reverse("activity")


def test_a_viewer_sees_their_tenants_activity_and_not_anothers(viewer_client, acme, outsider):
    mine, theirs = new_run(acme.worker), new_run(outsider.worker)
    admin_action_record(
        tenant=outsider.tenant, actor="user:gus", action="policy.change", subject="globex", reason="secret plan"
    )
    page = viewer_client.get(URL)
    body = page.content.decode()
    assert page.status_code == 200
    assert reverse("run_detail", args=[mine.pk]) in body
    assert reverse("run_detail", args=[theirs.pk]) not in body and "secret plan" not in body
    assert 'hx-trigger="every 10s"' in body


def test_the_feed_is_narrowed_by_the_filters(admin, acme):
    new_run(acme.worker)
    admin_action_record(
        tenant=acme.tenant, actor="user:ada", action="worker.drain", subject="w-1", reason="maintenance"
    )
    client = logged_in(admin)
    page = client.get(URL, {"who": "ada", "within": "1h"})
    assert [row.type for row in page.context["rows"]] == ["worker.drain"] and "maintenance" in page.content.decode()
    page = client.get(URL, {"kind": "worker", "tenant": "acme"})
    assert [row.type for row in page.context["rows"]] == ["RUN_CREATED"]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"since": "yesterday-ish"}, "since"),
        ({"until": "2026-13-45"}, "until"),
        ({"since": "2026-12-06T10:00", "until": "2026-12-06T09:00"}, "until"),
        ({"type": "DROP TABLE;"}, "type"),
        ({"who": "two words"}, "who"),
        ({"kind": "martian"}, "kind"),
        ({"tenant": "globex"}, "tenant"),  # not one the viewer sees
        ({"within": "forever"}, "within"),
    ],
)
def test_a_bad_filter_is_a_form_error_naming_the_field(viewer_client, outsider, params, field):
    page = viewer_client.get(URL, params)
    body = page.content.decode()
    assert page.status_code == 400
    assert f"{field}:" in body or f'name="{field}"' in body
    assert "Nothing searched" in body
    assert page.context["form"].errors.get(field)


def test_a_poll_gets_the_feed_partial_only(viewer_client, acme):
    new_run(acme.worker)
    page = viewer_client.get(URL, headers={"HX-Request": "true", "HX-Target": "activity-feed"})
    body = page.content.decode()
    assert page.status_code == 200 and body.lstrip().startswith('<div id="activity-feed"') and "<html" not in body


def test_a_poll_after_the_session_ended_sends_the_browser_to_sign_in(client):
    page = client.get(
        URL,
        headers={
            "HX-Request": "true",
            "HX-Target": "activity-feed",
            "HX-Current-URL": "http://testserver/activity/?who=ada",
        },
    )
    assert page.status_code == 200 and page["HX-Redirect"].startswith("/accounts/login/?next=")
    assert b"<form" not in page.content


def test_pages_go_forward_and_back(admin, acme):
    for _ in range(30):
        new_run(acme.worker)
    client = logged_in(admin)
    first = client.get(URL, {"size": "25"})
    rows = first.context["rows"]
    assert len(rows) == 25 and first.context["pager"]["next_url"]
    second = client.get(URL + first.context["pager"]["next_url"])
    assert len(second.context["rows"]) == 5 and second.context["pager"]["prev_url"]
    back = client.get(URL + second.context["pager"]["prev_url"])
    assert [(r.source, r.id) for r in back.context["rows"]] == [(r.source, r.id) for r in rows]


def test_signed_out_users_are_sent_to_sign_in(client):
    assert client.get(URL).status_code == 302


def test_without_a_role_the_feed_shows_nothing(roleless_client, acme, outsider):
    new_run(acme.worker), new_run(outsider.worker)
    admin_action_record(tenant=acme.tenant, actor="user:ada", action="policy.change", subject="acme", reason="r")
    page = roleless_client.get(URL)
    assert page.status_code == 200 and page.context["rows"] == []
    assert "Nothing happened that matches" in page.content.decode()
