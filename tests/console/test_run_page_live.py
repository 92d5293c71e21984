"""The run page while it stays open (issue 17): what changed comes in place (indicators,
lease, operations) with a marker of the events that arrived since it was opened; the
chain can be exported as the worker API exports it and verified on demand."""

import json

from django.conf import settings
from django.urls import reverse

from fenceline_client.evidence_verifier import verify_chain
from ledger.models import Run
from ledger.services.fence.notes import event_append
from ledger.services.tenancy.roles import role_grant
from tests.factories import dispatched_operation, leased_run, new_run
from tests.helpers import logged_in


def live(client, run, seen):
    return client.get(reverse("run_detail", args=[run.pk]), {"live": seen}, HTTP_HX_REQUEST="true")


def test_a_poll_swaps_the_indicators_lease_and_operations_and_counts_the_new_events(viewer_client, acme):
    run, token = leased_run(acme.worker)
    seen = Run.objects.get(pk=run.pk).last_seq
    quiet = live(viewer_client, run, seen).content.decode()
    assert "new event" not in quiet
    assert 'id="run-live"' in quiet and f"live={seen}" in quiet  # the next poll asks the same

    dispatched_operation(acme.worker, run, token, "k-live")
    event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"text": "hello"})
    head = Run.objects.get(pk=run.pk).last_seq
    body = live(viewer_client, run, seen).content.decode()

    assert f"{head - seen} new events" in body
    assert f'href="?after={seen}#timeline"' in body
    for region in ("run-status", "run-indicators", "run-lease", "run-operations"):
        assert f'id="{region}" hx-swap-oob="true"' in body
    assert "UNCERTAIN" in body and "DISPATCHED" in body  # the effect in flight, seen without a reload


def test_the_page_polls_only_while_nobody_works_in_it(viewer_client, acme):
    run, _ = leased_run(acme.worker)
    page = viewer_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert 'hx-trigger="every 5s" data-poll-pause-busy="#main"' in page


def test_every_event_shows_its_fields_and_the_legend_explains_unsealed(viewer_client, acme):
    run, token = leased_run(acme.worker)
    event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="NOTE", fields={"text": "a note"})
    body = viewer_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert '<details class="event-fields">' in body and "&quot;text&quot;: &quot;a note&quot;" in body
    assert "UNSEALED is normal while a run is active" in body
    assert f'data-copy="{run.pk}"' in body


def test_the_exported_chain_verifies_with_the_standalone_verifier(viewer_client, acme):
    run, token = leased_run(acme.worker)
    dispatched_operation(acme.worker, run, token, "k-export")
    response = viewer_client.get(reverse("run-export", args=[run.pk]))
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-chain.json"'
    document = json.loads(b"".join(response.streaming_content))
    head = document["head"]
    report = verify_chain(
        document["run_id"],
        document["events"],
        document["checkpoints"],
        settings.FENCELINE["CHECKPOINT_KEYS"],
        expected_head=(head["last_seq"], head["last_hash"]),
        event_keys=settings.FENCELINE["EVENT_KEYS"],
    )
    assert report.finding is None and report.events_checked == head["last_seq"]


def test_export_of_another_tenants_run_is_404(outsider_viewer_client, acme):
    assert outsider_viewer_client.get(reverse("run-export", args=[new_run(acme.worker).pk])).status_code == 404


def test_an_operator_verifies_a_run_now_and_a_viewer_may_not(viewer_client, acme):
    run, _ = leased_run(acme.worker)
    operator, _ = role_grant(username="otto", tenant=acme.tenant, role="operator")
    assert viewer_client.post(reverse("run-verify", args=[run.pk])).status_code == 403
    answer = logged_in(operator).post(reverse("run-verify", args=[run.pk]), follow=True)
    assert answer.status_code == 200
    said = answer.content.decode()
    assert "Verified 2 events: every hash and link holds;" in said  # not a bare "UNSEALED"
    assert "(UNSEALED: normal while a run is active)" in said
    assert Run.objects.get(pk=run.pk).verified_at is not None


def test_verify_now_of_another_tenants_run_is_404(acme, outsider):
    operator, _ = role_grant(username="otto", tenant=acme.tenant, role="operator")
    other = new_run(outsider.worker)
    assert logged_in(operator).post(reverse("run-verify", args=[other.pk])).status_code == 404
