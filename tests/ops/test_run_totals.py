"""The run totals /metrics reports (events accepted, UNKNOWN operations, active runs, ...): kept
by the count-run-totals job so that a scrape reads a row per tenant, and counted by the scrape
itself when the job is not fresh (issue 16)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Run, RunTotals
from ledger.observability.health import job_allowed_s
from ledger.observability.metrics import scrape
from ledger.services.fence.notes import event_append
from ledger.tasks import count_run_totals_task
from tests.factories import leased_run
from tests.helpers import metric_value, parse_metrics

pytestmark = pytest.mark.django_db


def scraped(name: str, tenant: str, suffix: str = "") -> float:
    return metric_value(parse_metrics(scrape().decode()), name, suffix, tenant=tenant)


def accepted(tenant) -> int:
    return sum(Run.objects.filter(tenant=tenant).values_list("last_seq", flat=True))


def test_a_scrape_reads_the_totals_the_job_counted_until_it_counts_again(acme):
    run, token = leased_run(acme.worker)
    count_run_totals_task.apply().get()
    counted = accepted(acme.tenant)
    assert RunTotals.objects.get(tenant=acme.tenant).accepted == counted > 0

    event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"n": 1})

    # The scrape reads the stored totals: the new event shows with the job's next count.
    assert scraped("audit_events_accepted", "acme", "_total") == counted
    assert scraped("fenceline_active_runs", "acme") == 1
    assert 0 <= scraped("fenceline_run_totals_age_seconds", "acme") < 60
    count_run_totals_task.apply().get()
    assert scraped("audit_events_accepted", "acme", "_total") == counted + 1 == accepted(acme.tenant)


def test_a_scrape_counts_itself_once_the_job_is_not_fresh(acme):
    run, token = leased_run(acme.worker)
    count_run_totals_task.apply().get()
    event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"n": 1})
    allowed = job_allowed_s("count-run-totals")  # what /readyz allows the job
    RunTotals.objects.update(counted_at=timezone.now() - timedelta(seconds=allowed + 1))

    assert scraped("audit_events_accepted", "acme", "_total") == accepted(acme.tenant)
    assert scraped("fenceline_run_totals_age_seconds", "acme") == 0  # counted by this scrape


def test_the_job_counts_each_tenant_s_runs(acme, outsider):
    leased_run(acme.worker)
    leased_run(outsider.worker)
    leased_run(outsider.worker)
    count_run_totals_task.apply().get()
    assert dict(RunTotals.objects.values_list("tenant__slug", "active")) == {"acme": 1, "globex": 2}
    assert scraped("fenceline_active_runs", "globex") == 2
