"""The resource reaper's first step: ACTIVE resources past a deadline, asked for release and
claimed at once, one RESOURCE_RELEASE_REQUESTED event per run whatever the batch size, and
the idle deadline measured from the run's last progress (issues 12 and 16)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Event, Run, RunResource
from ledger.services.lifespan.drivers import Closed, Closing, ResourceRef, SandboxDriver
from ledger.services.lifespan.reaper import BATCH_SPREAD, _close_all, resources_reap
from ledger.services.lifespan.resources import Attach, resource_attach
from tests.factories import leased_run
from tests.helpers import assert_chain_intact

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox_driver(tmp_path, settings):
    root = tmp_path / "sandbox"
    settings.FENCELINE = {**settings.FENCELINE, "SANDBOX_DIR": root}
    return SandboxDriver(root)


def attached(worker, count: int, name: str, **deadlines) -> tuple[Run, list[RunResource]]:
    run, token = leased_run(worker)
    resources = [
        resource_attach(
            worker=worker,
            run_id=run.pk,
            fencing_token=token,
            attach=Attach(kind="connection", provider="sandbox", handle=f"{name}-{n}", **deadlines),
        )[0]
        for n in range(count)
    ]
    return run, resources


def overdue(resources: list[RunResource]) -> None:
    RunResource.objects.filter(pk__in=[r.pk for r in resources]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )


def requests_of(run: Run) -> list[dict]:
    return [e.fields for e in Event.objects.filter(run=run, type="RESOURCE_RELEASE_REQUESTED").order_by("seq")]


def test_a_run_s_overdue_resources_are_asked_for_in_one_event_whatever_the_batch_size(acme, sandbox_driver):
    runs = []
    for n in range(3):
        run, resources = attached(acme.worker, 4, f"run{n}")
        overdue(resources)
        runs.append(run)

    result = resources_reap(batch_size=1)  # each batch reads one resource, and takes its run's others

    assert (result.requested, result.released, result.failed) == (12, 12, 0), result
    assert not RunResource.objects.exclude(state="RELEASED").exists()
    for run in runs:
        (asked,) = requests_of(run)
        assert (asked["count"], asked["reason"]) == (4, "deadline")
        assert len(asked["resource_ids"]) == 4
        assert Event.objects.filter(run=run, type="RESOURCE_RELEASED").count() == 4
        assert_chain_intact(run.pk)
    for resource in RunResource.objects.all():
        assert sandbox_driver.is_closed(resource.provider, resource.handle)
        # Asked for (the reason and the moment stay on the row) and claimed in one write.
        assert (resource.release_reason, resource.attempts) == ("deadline", 1)
        assert resource.release_requested_at is not None


def test_a_batch_claims_at_most_its_spread_and_the_pass_goes_on_with_the_rest(acme):
    run, resources = attached(acme.worker, BATCH_SPREAD + 3, "many")
    overdue(resources)

    result = resources_reap(batch_size=1)

    assert (result.requested, result.released, result.batches) == (BATCH_SPREAD + 3, BATCH_SPREAD + 3, 2), result
    assert sorted(asked["count"] for asked in requests_of(run)) == [3, BATCH_SPREAD]
    assert not RunResource.objects.exclude(state="RELEASED").exists()
    assert_chain_intact(run.pk)


def test_an_idle_resource_is_released_once_its_run_made_no_progress_for_idle_s(acme):
    long_ago = timezone.now() - timedelta(minutes=5)
    quiet, _ = attached(acme.worker, 2, "quiet", ttl_s=3600, idle_s=60)
    busy, _ = attached(acme.worker, 2, "busy", ttl_s=3600, idle_s=60)
    RunResource.objects.update(created_at=long_ago)
    Run.objects.filter(pk=quiet.pk).update(last_progress_at=long_ago)
    Run.objects.filter(pk=busy.pk).update(last_progress_at=timezone.now())  # it just checkpointed

    result = resources_reap(batch_size=1)

    assert (result.requested, result.released) == (2, 2), result
    assert set(RunResource.objects.filter(run=quiet).values_list("state", "release_reason")) == {("RELEASED", "idle")}
    assert set(RunResource.objects.filter(run=busy).values_list("state", flat=True)) == {"ACTIVE"}
    (asked,) = requests_of(quiet)
    assert (asked["count"], asked["reason"]) == (2, "idle")
    assert requests_of(busy) == []
    assert_chain_intact(quiet.pk)


class BrokenDriver:
    """A driver with a bug: every close raises."""

    name = "broken"

    def close(self, resource):
        raise RuntimeError("the driver's own message is not kept")


def test_a_hung_call_and_a_driver_s_bug_fail_their_resource_only(acme, settings):
    settings.FENCELINE = {
        **settings.FENCELINE,
        "RESOURCE_CLOSE_TIMEOUT_S": 1,
        "RESOURCE_CLOSE_CONCURRENCY": 2,
        "RESOURCE_DRIVERS": {
            **settings.FENCELINE["RESOURCE_DRIVERS"],
            "connection:broken": f"{__name__}.BrokenDriver",
        },
    }
    run, token = leased_run(acme.worker)
    handles = {"hung": ("sandbox", "hung?hang=5"), "buggy": ("broken", "buggy"), "fine": ("sandbox", "fine")}
    for provider, handle in handles.values():
        resource_attach(
            worker=acme.worker,
            run_id=run.pk,
            fencing_token=token,
            attach=Attach(kind="connection", provider=provider, handle=handle),
        )
    RunResource.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    result = resources_reap()

    assert (result.released, result.failed) == (1, 2), result
    outcome = dict(RunResource.objects.values_list("handle", "state"))
    assert outcome == {"hung?hang=5": "CLEANUP_FAILED", "buggy": "CLEANUP_FAILED", "fine": "RELEASED"}
    errors = dict(RunResource.objects.filter(state="CLEANUP_FAILED").values_list("provider", "last_error"))
    assert errors == {"sandbox": "driver sandbox timed out after 1 s", "broken": "RuntimeError in driver broken"}
    assert_chain_intact(run.pk)


def test_a_caller_whose_call_was_given_up_on_goes_on_with_the_batch(settings):
    """One caller: its first call hangs past the timeout (answered FAILED at once), and once
    it returns, the caller takes the rest of the batch."""
    settings.FENCELINE = {**settings.FENCELINE, "RESOURCE_CLOSE_TIMEOUT_S": 1, "RESOURCE_CLOSE_CONCURRENCY": 1}
    refs = [
        ResourceRef("r-hung", "connection", "sandbox", "hung?hang=2", 1),
        ResourceRef("r-after", "connection", "sandbox", "after", 1),
    ]

    answers = {ref.resource_id: (driver, closing) for ref, driver, closing in _close_all(refs)}

    assert answers["r-hung"][1] == Closing(Closed.FAILED, "driver sandbox timed out after 1 s")
    assert answers["r-after"][1].result in (Closed.CLOSED, Closed.ALREADY_GONE)


def test_an_empty_batch_calls_nothing():
    assert _close_all([]) == []
