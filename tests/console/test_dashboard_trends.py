"""The dashboard's trends: UNKNOWN effects opened and settled per hour (by people and by
reconcilers), stale-token rejections per hour, each tenant's cost burn against its breaker
thresholds, and the verifier's lag; only from tenants where the user has a role, each
chart with its numbers as text, polled by htmx as its own partial, in a constant number
of queries.

History is made through the real services; to place it in past hours, the services' clock
(``django.utils.timezone.now``) is moved back while they run (events cannot be updated)."""

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals.selectors import dashboard_trends
from ledger.services.evidence.verification import run_verify
from ledger.services.fence import leases, runs
from ledger.services.tenancy.roles import role_grant
from tests.console.trend_history import clock, refusals, spend, this_hour, unknown_history
from tests.factories import bulk_runs, leased_run, new_run, set_cost_policy, unknown_payment
from tests.helpers import logged_in

URL = reverse("home")
TRENDS = {"HX-Request": "true", "HX-Target": "trends"}

pytestmark = pytest.mark.django_db


def by_hour(rows: list[dict]) -> dict[datetime, dict]:
    return {row["hour"]: row for row in rows}


# --- the charts' numbers --------------------------------------------------------------------


def settled(row: dict) -> tuple[int, int, int]:
    return row["opened"], row["by_people"], row["by_reconciler"]


def test_unknown_effects_opened_and_settled_per_hour_split_by_people_and_by_reconcilers(
    acme, outsider, viewer, sandbox
):
    hour = this_hour()
    unknown_history(acme, hour, sandbox)
    unknown_history(outsider, hour, sandbox)  # globex: never in acme's charts

    trends = logged_in(viewer).get(URL).context["trends"]

    rows = trends["unknown"]["rows"]
    current = trends["now"].replace(minute=0, second=0, microsecond=0)  # hour, unless the clock struck since
    assert [row["hour"] for row in rows] == [current - timedelta(hours=23 - i) for i in range(24)]
    assert trends["since"] == rows[0]["hour"]
    hours = by_hour(rows)
    assert settled(hours[hour - timedelta(hours=5)]) == (2, 0, 0)
    assert settled(hours[hour - timedelta(hours=3)]) == (0, 1, 0)
    assert settled(hours[hour - timedelta(hours=1)]) == (1, 0, 1)
    assert sum(sum(settled(row)) for row in rows) == 5  # nothing in any other hour
    assert settled(trends["unknown"]) == (3, 1, 1)


def test_stale_token_rejections_per_hour_come_from_the_refusal_events(acme, outsider, viewer):
    hour = this_hour()
    with clock(hour - timedelta(hours=2, minutes=-5)):
        refusals(acme, 3)
        refusals(outsider, 5)
    with clock(hour - timedelta(hours=30)):  # before the 24 hours: not drawn
        refusals(acme, 4)
    with clock(hour + timedelta(seconds=1)):
        refusals(acme, 1)

    page = logged_in(viewer).get(URL)
    trends = page.context["trends"]

    assert page.context["counts"]["stale_rejections"] == 8  # the card counts all time
    hours = by_hour(trends["stale"]["rows"])
    assert hours[hour - timedelta(hours=2)]["refused"] == 3
    assert hours[hour]["refused"] == 1
    assert trends["stale"]["refused"] == 4
    assert sum(row["refused"] for row in trends["stale"]["rows"]) == 4


def test_cost_burn_is_each_tenants_current_window_against_its_breaker_thresholds(acme, outsider, viewer):
    # acme's window is charged through escrow shards (its limit is large enough for them).
    set_cost_policy(acme.tenant, tenant_limit=100_000)
    spend(acme, "summary-1", 30_000, actual=25_000)
    spend(acme, "summary-2", 40_000)  # still reserved
    set_cost_policy(
        outsider.tenant, tenant_limit=5_000, breaker={"throttled_at": 0.5, "degraded_at": 0.7, "open_at": 0.9}
    )
    spend(outsider, "globex-1", 4_000)

    page = logged_in(viewer).get(URL)
    (burn,) = page.context["trends"]["cost"]

    assert burn["tenant"].slug == "acme"
    assert (burn["limit_cents"], burn["settled_cents"], burn["reserved_cents"], burn["used_cents"]) == (
        100_000,
        25_000,
        40_000,
        65_000,
    )
    assert burn["share"] == pytest.approx(0.65)
    assert burn["thresholds"] == {"throttled_at": 0.6, "degraded_at": 0.85, "open_at": 1.0}
    assert burn["window_starts_at"] <= timezone.now() < burn["window_ends_at"]
    html = page.content.decode()
    assert "65,000 of 100,000 cents (65%)" in html
    assert "THROTTLED at 60%, DEGRADED at 85%, OPEN at 100%" in html  # the meter's text alternative
    assert html.count('class="burn-mark"') == 3

    gail, _ = role_grant(username="gail", tenant=outsider.tenant, role="viewer")
    role_grant(username="gail", tenant=acme.tenant, role="viewer")
    globex = {b["tenant"].slug: b for b in logged_in(gail).get(URL).context["trends"]["cost"]}["globex"]
    assert (globex["limit_cents"], globex["reserved_cents"], globex["used_cents"]) == (5_000, 4_000, 4_000)
    assert globex["thresholds"] == {"throttled_at": 0.5, "degraded_at": 0.7, "open_at": 0.9}


def test_a_tenant_without_a_cost_limit_is_shown_as_such(acme, viewer):
    (burn,) = logged_in(viewer).get(URL).context["trends"]["cost"]
    assert burn["limit_cents"] is None and burn["share"] is None
    assert "no tenant cost limit" in logged_in(viewer).get(URL).content.decode()


def test_the_verification_lag_is_the_newest_checkpoints_age_and_the_events_not_yet_verified(acme, viewer):
    done, token = leased_run(acme.worker)
    runs.run_complete(worker=acme.worker, run_id=done.pk, fencing_token=token)
    run_verify(run_id=done.pk)  # sealed with a checkpoint: nothing left to verify in it
    waiting, token = leased_run(acme.worker)
    leases.lease_renew(worker=acme.worker, run_id=waiting.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)
    bulk_runs(acme.tenant, 3, start=timezone.now() - timedelta(days=3), last_seq=50)  # older than 24 h: not counted
    waiting.refresh_from_db()

    (lag,) = logged_in(viewer).get(URL).context["trends"]["verification"]

    assert lag["last_verified_at"] is not None and 0 <= lag["lag_s"] < 60
    assert (lag["runs"], lag["runs_waiting"]) == (2, 1)
    assert lag["events_unverified"] == waiting.last_seq > 0
    done.refresh_from_db()
    assert lag["events_unsealed"] == waiting.last_seq + done.last_seq - done.verified_checkpoint_seq


def test_a_tenant_never_verified_says_so(acme, viewer):
    new_run(acme.worker)
    page = logged_in(viewer).get(URL)
    (lag,) = page.context["trends"]["verification"]
    assert lag["last_verified_at"] is None and lag["lag_s"] is None
    assert "never verified" in page.content.decode()


# --- scope, text, polling, queries ----------------------------------------------------------


def test_another_tenants_numbers_never_appear(acme, outsider, outsider_viewer_client, sandbox):
    hour = this_hour()
    unknown_history(acme, hour, sandbox)
    refusals(acme, 2)
    set_cost_policy(acme.tenant, tenant_limit=10_000)
    spend(acme, "acme-secret-spend", 7_000)
    acme_run, token = leased_run(acme.worker)
    runs.run_complete(worker=acme.worker, run_id=acme_run.pk, fencing_token=token)
    run_verify(run_id=acme_run.pk)

    page = outsider_viewer_client.get(URL)
    trends = page.context["trends"]

    assert trends["unknown"]["opened"] == trends["unknown"]["by_people"] == trends["unknown"]["by_reconciler"] == 0
    assert trends["stale"]["refused"] == 0
    assert [b["tenant"].slug for b in trends["cost"]] == ["globex"]
    assert [v["tenant"].slug for v in trends["verification"]] == ["globex"]
    assert trends["verification"][0]["last_verified_at"] is None
    trends_html = outsider_viewer_client.get(URL, headers=TRENDS).content.decode()
    assert "acme" not in trends_html and "7,000" not in trends_html and "10,000" not in trends_html


def test_each_chart_comes_with_its_numbers_as_a_text_table(acme, viewer):
    refusals(acme, 2)
    html = logged_in(viewer).get(URL).content.decode()

    assert html.count('<figure class="trend"') == 4
    assert html.count('<details class="trend-numbers">') == 4
    assert html.count('<table class="trend-table">') == 4
    assert html.count('role="img"') == 2  # the hourly charts; acme has no cost limit, so no meter
    for title in ("UNKNOWN effects opened and settled", "Stale-token rejections", "Cost burn", "Verification lag"):
        assert title in html
    assert (
        'aria-label="Stale-token rejections, per hour over the last 24 hours: 2 stale-token rejections in all' in html
    )
    assert '<th scope="row">' in html and "hour (UTC)" in html


def test_a_user_with_no_tenants_still_gets_the_dashboard_and_its_trends(roleless_client, acme):
    refusals(acme, 1)
    page = roleless_client.get(URL)
    assert page.status_code == 200
    trends = page.context["trends"]
    assert trends["cost"] == trends["verification"] == []
    assert trends["stale"]["refused"] == 0 and len(trends["stale"]["rows"]) == 24
    assert "No trends to show" in page.content.decode()
    partial = roleless_client.get(URL, headers=TRENDS)
    assert partial.status_code == 200 and "No trends to show" in partial.content.decode()


def test_htmx_polls_the_trends_partial_every_minute_apart_from_the_counts(viewer_client):
    full = viewer_client.get(URL).content.decode()
    assert '<section id="trends"' in full and 'hx-trigger="every 10s"' in full
    # every minute, but not while someone reads a table of numbers (static/js/console.js)
    assert 'hx-trigger="every 60s" data-poll-pause-busy="#trends"' in full

    trends = viewer_client.get(URL, headers=TRENDS)
    html = trends.content.decode()
    assert html.lstrip().startswith('<section id="trends"') and "<html" not in html and 'id="counts"' not in html
    assert "counts" not in trends.context

    counts = viewer_client.get(URL, headers={"HX-Request": "true", "HX-Target": "counts"})
    html = counts.content.decode()
    assert html.lstrip().startswith('<div id="counts"') and 'id="trends"' not in html
    assert "trends" not in counts.context
    assert "HX-Target" in trends["Vary"]


def count_queries(client, **kwargs) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(URL, **kwargs).status_code == 200
    return len(ctx.captured_queries)


def test_the_number_of_queries_does_not_grow_with_the_history(acme, outsider, viewer, sandbox):
    client = logged_in(viewer)
    hour = this_hour()
    unknown_history(acme, hour, sandbox)
    set_cost_policy(acme.tenant, tenant_limit=100_000)
    refusals(acme, 1)
    spend(acme, "first", 1_000, actual=900)
    count_queries(client)  # once, so that nothing cached per process is counted
    few_trends, few_page = count_queries(client, headers=TRENDS), count_queries(client)

    # More of everything, in more hours, and a second tenant with its own limit and history.
    role_grant(username=viewer.username, tenant=outsider.tenant, role="viewer")
    set_cost_policy(outsider.tenant, tenant_limit=50_000)
    for i in range(3):
        with clock(hour - timedelta(hours=4 + i)):
            for n in range(3):
                unknown_payment(acme.worker, f"more-{i}-{n}")  # with a cost estimate: acme has a limit now
            for n in range(2):
                unknown_payment(outsider.worker, f"more-{i}-{n}")
            refusals(acme, 2)
            refusals(outsider, 2)
    spend(acme, "second", 2_000)
    spend(outsider, "globex", 3_000, actual=2_500)
    bulk_runs(acme.tenant, 50, start=timezone.now() - timedelta(hours=2), last_seq=7)
    trends = dashboard_trends(user=viewer)
    assert trends["unknown"]["opened"] == 3 + 9 + 6 and trends["stale"]["refused"] == 1 + 6 + 6
    assert [b["tenant"].slug for b in trends["cost"] if b["used_cents"]] == ["acme", "globex"]

    assert count_queries(client, headers=TRENDS) == few_trends
    assert count_queries(client) == few_page


# --- the drawing ------------------------------------------------------------------------------


def test_the_hourly_columns_stack_within_a_group_on_a_scale_with_a_whole_middle():
    from console.templatetags.charts import hourly_chart

    hour = this_hour()
    rows = [
        {"hour": hour - timedelta(hours=23 - i), "opened": 0, "by_people": 0, "by_reconciler": 0} for i in range(24)
    ]
    rows[10].update(opened=5, by_people=2, by_reconciler=3)
    chart = hourly_chart(rows, "opened|by_people,by_reconciler", "c", "UNKNOWN effects")

    assert (chart["top"], chart["half"]) == (6, 3)
    assert [bar["css"] for bar in chart["bars"]] == ["series-opened", "series-people", "series-reconciler"]
    opened, people, reconciler = (float(bar["height"]) for bar in chart["bars"])
    assert opened == pytest.approx(people + reconciler)  # 5 = 2 + 3, on one scale
    assert float(chart["bars"][2]["y"]) + reconciler == pytest.approx(float(chart["bars"][1]["y"]))  # stacked
    assert [len(row["values"]) for row in chart["rows"]] == [3] * 24


def test_the_verification_age_is_drawn_against_the_verifiers_allowance_at_least():
    from console.templatetags.charts import verification_chart

    lag = {"lag_s": 2, "events_unverified": 0}
    chart = verification_chart([lag], 120)
    assert chart["rows"][0]["lag_w"] == "1.667%" and chart["allowance_x"] == "100.000%"
    late = verification_chart([lag, {"lag_s": 480, "events_unverified": 10}], 120)
    assert [row["lag_w"] for row in late["rows"]] == ["0.417%", "100.000%"] and late["allowance_x"] == "25.000%"
