"""Stuck runs (issue 40): an ACTIVE run with no lease, or no progress, for longer than its
tenant's ``stuck_after_s`` is flagged — the runs list's "stuck" filter and badge, the
dashboard's card (capped), ``fenceline_stuck_runs``, and the run page with the actions that
apply; within the limit, finished, or another tenant's: not."""

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Run, RunLease
from ledger.observability import stuck as stuck_module
from ledger.observability.metrics import scrape
from ledger.selectors import runs_stuck_flags
from tests.factories import leased_run, new_run, set_policy, user_with
from tests.helpers import logged_in, metric_value, parse_metrics


def aged(run, *, minutes: int, lease_too: bool = True) -> Run:
    """The test's clock: the run was created and last progressed ``minutes`` ago (and its
    lease, when not held, ended then)."""
    then = timezone.now() - timedelta(minutes=minutes)
    Run.objects.filter(pk=run.pk).update(created_at=then, last_progress_at=then)
    if lease_too:
        RunLease.objects.filter(run=run, owner_id__isnull=True, expires_at__isnull=False).update(expires_at=then)
    return Run.objects.select_related("lease").get(pk=run.pk)


def cast(acme):
    """Four runs of acme: never leased for an hour (stuck: no lease), held with no progress
    for an hour (stuck: no progress), held and progressing (fine), and one finished an hour
    ago (not ACTIVE: never stuck)."""
    idle = aged(new_run(acme.worker), minutes=60)
    held, _ = leased_run(acme.worker, ttl_s=3600)
    quiet = aged(held, minutes=60)
    busy, _ = leased_run(acme.worker, ttl_s=3600)
    done = aged(new_run(acme.worker), minutes=60)
    Run.objects.filter(pk=done.pk).update(status="COMPLETED")
    return idle, quiet, busy, done


def test_no_lease_or_no_progress_past_the_limit_is_stuck(acme):
    idle, quiet, busy, done = cast(acme)
    runs = list(Run.objects.select_related("lease").filter(pk__in=[idle.pk, quiet.pk, busy.pk, done.pk]))
    flags = runs_stuck_flags(runs)
    assert set(flags) == {idle.pk, quiet.pk}
    assert flags[idle.pk].no_lease and flags[idle.pk].no_progress
    assert flags[quiet.pk].no_progress and not flags[quiet.pk].no_lease
    assert flags[idle.pk].limit_text == "15 min"


def test_the_limit_is_the_tenants_policy(acme):
    run = aged(new_run(acme.worker), minutes=10)
    assert runs_stuck_flags([run]) == {}  # 10 min < the starter's 15
    set_policy(acme.tenant, stuck_after_s=300)
    assert set(runs_stuck_flags([run])) == {run.pk}
    assert stuck_module.stuck_limits([acme.tenant.pk]) == {acme.tenant.pk: 300}


def test_the_runs_list_filters_the_stuck_and_flags_them(viewer_client, acme, outsider):
    idle, quiet, busy, done = cast(acme)
    foreign = aged(new_run(outsider.worker), minutes=60)
    page = viewer_client.get(reverse("runs"), {"stuck": "yes"})
    shown = {row["run"].pk for row in page.context["rows"]}
    assert shown == {idle.pk, quiet.pk} and foreign.pk not in shown
    body = page.content.decode()
    assert body.count(">STUCK</span>") == 2 and "no lease" in body and "no progress" in body
    everything = viewer_client.get(reverse("runs"))
    assert {row["run"].pk for row in everything.context["rows"]} >= {busy.pk, done.pk}
    assert everything.content.decode().count(">STUCK</span>") == 2


def test_the_stuck_filter_costs_a_constant_number_of_queries(viewer_client, acme):
    for _ in range(3):
        aged(new_run(acme.worker), minutes=60)
    viewer_client.get(reverse("runs"), {"stuck": "yes"})
    with CaptureQueriesContext(connection) as few:
        viewer_client.get(reverse("runs"), {"stuck": "yes"})
    for _ in range(5):
        aged(new_run(acme.worker), minutes=60)
    with CaptureQueriesContext(connection) as more:
        viewer_client.get(reverse("runs"), {"stuck": "yes"})
    assert len(more) == len(few)


def test_the_dashboard_counts_the_stuck_runs_of_the_users_tenants(viewer_client, roleless_client, acme, outsider):
    cast(acme)
    aged(new_run(outsider.worker), minutes=60)
    counts = viewer_client.get(reverse("home")).context["counts"]
    assert counts["stuck_runs"] == 2
    assert 'href="/runs/?stuck=yes"' in viewer_client.get(reverse("home")).content.decode()
    assert roleless_client.get(reverse("home")).context["counts"]["stuck_runs"] == 0


def test_the_dashboards_count_is_capped(viewer_client, acme, settings, monkeypatch):
    for _ in range(3):
        aged(new_run(acme.worker), minutes=60)
    monkeypatch.setattr("ledger.selectors.DASHBOARD_COUNT_CAP", 2)
    page = viewer_client.get(reverse("home"))
    assert page.context["counts"]["stuck_runs"] == 2 and "stuck_runs" in page.context["counts"]["capped"]
    assert ">2+</div>" in page.content.decode()


def test_the_metric_counts_the_stuck_runs_per_tenant(acme, outsider):
    cast(acme)
    aged(new_run(outsider.worker), minutes=60)
    families = parse_metrics(scrape().decode())
    assert metric_value(families, "fenceline_stuck_runs", tenant=acme.tenant.slug) == 2
    assert metric_value(families, "fenceline_stuck_runs", tenant=outsider.tenant.slug) == 1


def test_the_run_page_says_why_and_offers_what_applies(acme, admin, viewer_client, operator):
    held, _ = leased_run(acme.worker, ttl_s=3600)
    quiet = aged(held, minutes=60)
    url = reverse("run_detail", args=[quiet.pk])
    as_admin = logged_in(admin).get(url).content.decode()
    assert "STUCK" in as_admin and "no progress for" in as_admin
    assert reverse("run-force-release", args=[quiet.pk]) in as_admin and "#cancel-run" in as_admin
    as_operator = logged_in(operator).get(url).content.decode()
    assert "#cancel-run" in as_operator and reverse("run-force-release", args=[quiet.pk]) not in as_operator
    as_viewer = viewer_client.get(url).content.decode()
    assert "STUCK" in as_viewer and "Operators may cancel it" in as_viewer
    assert reverse("run-force-release", args=[quiet.pk]) not in as_viewer


def test_the_filter_applies_each_tenants_own_limit(acme, outsider):
    root = user_with(None, acme.tenant, "root")
    root.is_superuser = True
    root.save()
    set_policy(acme.tenant, stuck_after_s=300)
    ours = aged(new_run(acme.worker), minutes=10)  # past acme's 5 min
    theirs = aged(new_run(outsider.worker), minutes=10)  # within globex's 15 min
    page = logged_in(root).get(reverse("runs"), {"stuck": "yes"})
    assert {row["run"].pk for row in page.context["rows"]} == {ours.pk}
    assert theirs.pk not in {row["run"].pk for row in page.context["rows"]}
