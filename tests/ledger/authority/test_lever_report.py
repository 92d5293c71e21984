"""What the breaker's levers did, per tenant (ledger/observability/cost_report.py): cost by
provider, reserved cents of UNKNOWN operations, retry cost, fallback rate and denials by
reason — in the selector, on the tenant page and in /metrics; another tenant's spend is in
none of acme's."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.errors import Denied
from ledger.models import CostReservation
from ledger.observability.cost_report import REPORT_WINDOW, lever_report
from ledger.observability.metrics import scrape
from ledger.services.fence import operations, outcomes, retry
from tests.factories import leased_run, planned_op, set_cost_policy
from tests.helpers import Browser, metric_value, parse_metrics


def call(identity, run, token, key, *, estimate, provider, outcome="CONFIRMED", actual=None, fallback=None):
    op = planned_op(identity, run, token, key, estimate=estimate, provider=provider)
    operations.operation_authorize(worker=identity.worker, operation_id=op.pk, fencing_token=token)
    operations.operation_dispatch(worker=identity.worker, operation_id=op.pk, fencing_token=token)
    return outcomes.operation_report_outcome(
        worker=identity.worker,
        operation_id=op.pk,
        fencing_token=token,
        outcome=outcome,
        actual_cost_cents=actual,
        fallback_used=fallback,
    )


def spend(identity):
    """Four dispatches at two providers (one UNKNOWN, one retried, one with a fallback) and a
    dispatch refused by the provider budget."""
    set_cost_policy(identity.tenant, provider={"blocked": 0})
    run, token = leased_run(identity.worker)
    call(identity, run, token, "a", estimate=100, provider="openai", actual=80, fallback=True)
    call(identity, run, token, "b", estimate=50, provider="anthropic", actual=40, fallback=False)
    failed = call(identity, run, token, "d", estimate=30, provider="openai", outcome="FAILED", actual=10)
    retried = retry.operation_retry(worker=identity.worker, operation_id=failed.pk, fencing_token=token)
    operations.operation_authorize(worker=identity.worker, operation_id=retried.pk, fencing_token=token)
    operations.operation_dispatch(worker=identity.worker, operation_id=retried.pk, fencing_token=token)
    outcomes.operation_report_outcome(
        worker=identity.worker, operation_id=retried.pk, fencing_token=token, outcome="CONFIRMED", actual_cost_cents=25
    )
    call(identity, run, token, "c", estimate=70, provider="openai", outcome="UNKNOWN")  # the breaker: UNKNOWN
    with pytest.raises(Denied):
        call(identity, run, token, "e", estimate=5, provider="blocked")


def test_the_report_adds_up_cost_by_provider_unknown_retries_fallbacks_and_denials(acme, outsider):
    spend(acme)
    spend(outsider)

    report = lever_report(tenant_id=acme.tenant.pk, now=timezone.now())

    by_provider = {p.provider: p for p in report.providers}
    assert set(by_provider) == {"openai", "anthropic"}
    assert (by_provider["openai"].dispatches, by_provider["openai"].settled_cents) == (4, 80 + 10 + 25)
    assert by_provider["openai"].unknown_cents == 70
    assert (by_provider["anthropic"].dispatches, by_provider["anthropic"].settled_cents) == (1, 40)
    assert (report.unknown_reserved_cents, report.unknown_reservations) == (70, 1)
    assert (report.retry_cents, report.retry_dispatches) == (25, 1)
    assert (report.fallback_dispatches, report.dispatches) == (1, 5)
    assert report.fallback_rate == pytest.approx(0.2)
    assert report.denials == {"DENY_BUDGET": 1}


def test_the_report_looks_back_one_window_only(acme):
    spend(acme)
    CostReservation.objects.update(created_at=timezone.now() - REPORT_WINDOW * 2)
    report = lever_report(tenant_id=acme.tenant.pk, now=timezone.now())
    assert report.providers == [] and report.dispatches == 0
    assert report.unknown_reserved_cents == 70  # held until reconciled, whenever it was made


def test_the_tenant_page_shows_the_report_in_a_constant_number_of_queries(acme, outsider, viewer):
    browser = Browser(viewer)
    with CaptureQueriesContext(connection) as before:
        assert browser.get(reverse("tenant_detail", args=["acme"])).status_code == 200
    spend(acme)
    spend(outsider)
    with CaptureQueriesContext(connection) as after:
        page = browser.get(reverse("tenant_detail", args=["acme"]))
    body = page.content.decode()
    assert "Cost and refusals in the last hour" in body and "openai" in body and "DENY_BUDGET" in body
    assert "20% <span" in body  # the fallback rate: 1 of 5
    assert page.context["levers_report"].unknown_reserved_cents == 70
    assert len(after) == len(before)


def test_metrics_carry_the_report_per_tenant(acme, outsider):
    spend(acme)
    families = parse_metrics(scrape().decode())
    tenant = acme.tenant.slug
    assert metric_value(families, "fenceline_unknown_reserved_cents", tenant=tenant) == 70
    assert metric_value(families, "fenceline_retry_cost_cents", tenant=tenant) == 25
    assert metric_value(families, "fenceline_fallback_rate", tenant=tenant) == pytest.approx(0.2)
    assert metric_value(families, "fenceline_denials", tenant=tenant, reason="DENY_BUDGET") == 1
    assert (
        metric_value(families, "fenceline_cost_by_provider_cents", tenant=tenant, provider="openai", state="settled")
        == 115
    )
    assert outsider.tenant.slug not in str(families.get("fenceline_denials"))
