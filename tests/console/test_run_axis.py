"""The run page's time axis (issue 40): leases with their takeovers and the gaps with no
lease, operations from intent to outcome with their UNKNOWN spans, approvals; each bar with
its words in a title and each lane with an aria-label (readable without colour), the same
spans as a list; bounded: one query of its own however many events, operations beyond the
drawn rows counted, not drawn."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals import run_axis
from approvals import selectors as approvals_selectors
from ledger import selectors
from ledger.models import Run
from ledger.services.fence import leases, outcomes
from ledger.services.fence.notes import event_append
from tests.factories import dispatched_operation, expire, intended_operation, leased_run, pending_approvals


def axis_of(run):
    run = Run.objects.select_related("lease").get(pk=run.pk)
    ops = approvals_selectors.run_operations(run=run)
    grants = selectors.run_detail_parts(run=run)["grants"]
    return run_axis.run_time_axis(run=run, operations=ops, grants=grants)


def test_a_takeover_shows_both_leases_the_mark_and_the_unknown_span(acme):
    run, token = leased_run(acme.worker, owner="owner-a")
    dispatched_operation(acme.worker, run, token, "send-1")
    expire(run)
    leases.lease_acquire(worker=acme.worker, run_id=run.pk, owner_id="owner-b", ttl_s=60)

    axis = axis_of(run)
    lease_lane, op_lane = axis["lanes"][0], axis["lanes"][1]
    held = [s for s in lease_lane.spans if s.kind == "held"]
    assert [s.label for s in held] == [f"token {token}", f"token {token + 1}"]
    assert held[1].mark == "takeover" and "took over from owner-a" in held[1].title
    assert "(expired)" in held[0].title
    kinds = [s.kind for s in op_lane.spans]
    assert kinds == ["intent", "dispatched", "unknown"]
    assert "LEASE_LOST" in op_lane.spans[-1].title and "not reconciled yet" in op_lane.spans[-1].title
    assert axis["takeovers"] == 1
    for lane in axis["lanes"]:
        for span in lane.spans:
            assert 0 <= span.x <= 100 and 0 < span.width <= 100


def test_a_released_lease_leaves_a_no_lease_gap(acme):
    run, token = leased_run(acme.worker, owner="owner-a")
    leases.lease_release(worker=acme.worker, run_id=run.pk, owner_id="owner-a", fencing_token=token)
    lane = axis_of(run)["lanes"][0]
    assert [s.kind for s in lane.spans] == ["held", "no-lease"]
    assert "(released)" in lane.spans[0].title and "no lease from" in lane.spans[1].title


def test_approvals_have_their_lane(acme):
    (approval,) = pending_approvals(acme.worker, 1)
    axis = axis_of(approval.run)
    names = [lane.name for lane in axis["lanes"]]
    assert "Approvals" in names
    (span,) = axis["lanes"][names.index("Approvals")].spans
    assert span.kind == "approval" and "PENDING" in span.title


def test_the_axis_reads_no_events_one_query_however_long_the_run(acme):
    run, token = leased_run(acme.worker)
    for i in range(30):
        event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"i": i})
    loaded = Run.objects.select_related("lease").get(pk=run.pk)
    ops = approvals_selectors.run_operations(run=loaded)
    grants = selectors.run_detail_parts(run=loaded)["grants"]
    with CaptureQueriesContext(connection) as queries:
        run_axis.run_time_axis(run=loaded, operations=ops, grants=grants)
    assert len(queries) == 1 and "approvals_approvalrequest" in queries[0]["sql"]


def test_operations_past_the_drawn_rows_are_counted_not_drawn(acme, monkeypatch):
    monkeypatch.setattr(run_axis, "OPERATION_ROWS", 2)
    run, token = leased_run(acme.worker)
    for i in range(3):
        intended_operation(acme.worker, run, token, f"op-{i}")
    axis = axis_of(run)
    assert axis["operations_drawn"] == 2 and axis["operations_left_out"] == 1


def test_the_page_draws_it_with_words_and_a_list(viewer_client, acme):
    run, token = leased_run(acme.worker, owner="owner-a")
    op = dispatched_operation(acme.worker, run, token, "send-1", "IDEMPOTENT")
    outcomes.operation_report_outcome(worker=acme.worker, operation_id=op.pk, fencing_token=token, outcome="CONFIRMED")
    body = viewer_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert 'id="time-axis"' in body and 'role="img"' in body
    assert f'aria-label="Leases: token {token} held by owner-a' in body
    assert "<title>dispatched at" in body and "The axis as a list" in body
