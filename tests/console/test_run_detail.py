"""A run's page: 404 without a role and for another tenant's run; the four indicators with
their reasons, the timeline with seq and hash, lease history with tokens and stale-write
refusals, operations with phases (RECONCILED named and explained), budgets; a constant
number of queries."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals.services.cases import case_resolve
from approvals.services.handoff import open_case_for
from ledger.errors import StaleToken
from ledger.models import Run
from ledger.services.fence import leases, outcomes
from ledger.services.fence.notes import event_append
from ledger.services.lifespan.checkpoints import checkpoint_save
from tests.factories import dispatched_operation, expire, leased_run, new_run
from tests.helpers import logged_in


def url(run) -> str:
    return reverse("run_detail", args=[run.pk])


def test_without_a_role_a_run_is_404(roleless_client, acme):
    assert roleless_client.get(url(new_run(acme.worker))).status_code == 404


def test_a_viewer_reads_the_run_with_its_indicators_and_chain(viewer_client, acme):
    run, _ = leased_run(acme.worker)
    run = Run.objects.get(pk=run.pk)
    page = viewer_client.get(url(run))
    body = page.content.decode()
    assert page.status_code == 200
    assert str(run.pk) in body and run.last_hash in body
    for value in ("COMPLETE", "UNSEALED", "OK", "CERTAIN"):
        assert f">{value}</span>" in body
    assert f"no checkpoint yet for head seq {run.last_seq}" in body
    assert [e.seq for e in page.context["events"]] == [1, 2]
    assert "RUN_CREATED" in body and page.context["events"][0].hash[:23] in body


def test_another_tenants_run_is_404(viewer_client, outsider_viewer_client, acme, outsider):
    assert viewer_client.get(url(new_run(outsider.worker))).status_code == 404
    assert outsider_viewer_client.get(url(new_run(acme.worker))).status_code == 404


def test_an_unknown_run_id_is_404(viewer_client):
    assert viewer_client.get(reverse("run_detail", args=[uuid.uuid4()])).status_code == 404


def test_lease_history_shows_owners_tokens_and_the_stale_write_refused(viewer_client, acme):
    run, old_token = leased_run(acme.worker, owner="owner-a")
    expire(run)
    taken = leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=30)
    with pytest.raises(StaleToken):
        event_append(worker=acme.worker, run_id=run.pk, fencing_token=old_token, type="NOTE", fields={"text": "late"})
    page = viewer_client.get(url(run))
    body = page.content.decode()
    assert [(g.fencing_token, g.owner_id) for g in page.context["grants"]] == [
        (taken.fencing_token, "owner-b"),
        (old_token, "owner-a"),
    ]
    [refusal] = page.context["refusals"]
    assert refusal.fields["presented_token"] == old_token and refusal.fields["current_token"] == taken.fencing_token
    assert "Stale-write refusals" in body and "event.append" in body
    assert "<dd>1</dd>" in body  # the run's stale-write count


def test_the_latest_progress_checkpoint_is_shown_with_who_saved_it(viewer_client, acme):
    run, token = leased_run(acme.worker, owner="owner-a")
    assert "No progress checkpoint" in viewer_client.get(url(run)).content.decode()
    for position in ("page-1", "page-2"):
        checkpoint_save(
            worker=acme.worker, run_id=run.pk, fencing_token=token, position=position, state={"p": position}
        )
    body = viewer_client.get(url(run)).content.decode()
    assert "Progress checkpoint <strong>2</strong>" in body and "page-2" in body and "owner-a" in body
    assert "page-1" not in body.split("<h3>History</h3>")[0].split("<h3>Progress</h3>")[1]


def test_reconciled_is_shown_apart_from_confirmed_with_who_and_why(viewer_client, acme):
    run, token = leased_run(acme.worker)
    confirmed = dispatched_operation(acme.worker, run, token, "k-ok")
    outcomes.operation_report_outcome(
        worker=acme.worker, operation_id=confirmed.pk, fencing_token=token, outcome="CONFIRMED"
    )
    unknown = dispatched_operation(acme.worker, run, token, "k-unknown")
    outcomes.operation_report_outcome(
        worker=acme.worker, operation_id=unknown.pk, fencing_token=token, outcome="UNKNOWN"
    )
    case_resolve(
        case_id=open_case_for(unknown.pk).pk,
        resolution="HAPPENED",
        reason="seen in the provider's outbox",
        resolved_by="olga",
        provider_request_id="prov-123",
    )
    body = viewer_client.get(url(run)).content.decode()
    assert '<span class="badge badge-ok">CONFIRMED</span>' in body
    assert "RECONCILED: HAPPENED" in body
    assert "by <strong>olga</strong>" in body and "seen in the provider&#x27;s outbox" in body


def test_timeline_pages_by_seq_with_a_cursor(viewer_client, acme):
    run, token = leased_run(acme.worker)  # seq 1, 2
    for i in range(60):
        event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"i": i})
    first = viewer_client.get(url(run))
    assert [e.seq for e in first.context["events"]] == list(range(1, 51))
    assert first.context["next_after"] == 50
    second = viewer_client.get(url(run), {"after": 50})
    assert [e.seq for e in second.context["events"]] == list(range(51, 63))
    assert second.context["next_after"] is None
    partial = viewer_client.get(url(run), {"after": 50}, headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="timeline-page">') and "<html" not in partial


def test_breaker_state_and_broken_integrity_are_spelled_out(viewer_client, acme):
    run = new_run(acme.worker)
    Run.objects.filter(pk=run.pk).update(
        broken_reason="mutated", broken_first_seq=1, broken_last_seq=1, broken_detail="hash differs"
    )
    type(acme.tenant).objects.filter(pk=acme.tenant.pk).update(
        breaker_state="OPEN", breaker_reason="tenant spend limit"
    )
    body = viewer_client.get(url(run)).content.decode()
    assert ">BROKEN</span>" in body and "mutated at seq 1..1: hash differs" in body
    assert ">OPEN</span>" in body and "tenant spend limit" in body


def count_queries(client, run) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url(run)).status_code == 200
    return len(ctx.captured_queries)


def test_the_number_of_queries_does_not_grow_with_events_and_operations(viewer, acme):
    client = logged_in(viewer)
    small, small_token = leased_run(acme.worker)
    big, big_token = leased_run(acme.worker, owner="owner-big")
    for run, token, n in ((small, small_token, 10), (big, big_token, 200)):
        for i in range(n // 10):
            op = dispatched_operation(acme.worker, run, token, f"{run.pk}-{i}")
            outcomes.operation_report_outcome(
                worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="UNKNOWN"
            )
        for i in range(n):
            event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"i": i})
    assert count_queries(client, small) == count_queries(client, big)
