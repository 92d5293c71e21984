"""The resource reaper's instance pass (issue 41): an EXPIRED instance that never held a
resource had nothing for cleanup to verify, and goes to RELEASED in one event naming both
states; one that held resources still records REAPING, then RELEASED with its cleanup
verified, once its driver confirmed the last one closed."""

import pytest

from ledger.models import Event, LeaseGrant
from ledger.services.fence.leases import leases_reap
from ledger.services.lifespan.drivers import SandboxDriver
from ledger.services.lifespan.reaper import resources_reap
from ledger.services.lifespan.resources import Attach, resource_attach, resource_release
from tests.factories import expire, leased_run
from tests.helpers import assert_chain_intact

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox_driver(tmp_path, settings):
    root = tmp_path / "sandbox"
    settings.FENCELINE = {**settings.FENCELINE, "SANDBOX_DIR": root}
    return SandboxDriver(root)


def after_the_lease(run) -> list[tuple[str, dict]]:
    """The events of ``run`` after its LEASE_EXPIRED: (type, fields)."""
    expired = Event.objects.get(run=run, type="LEASE_EXPIRED").seq
    return [(e.type, e.fields) for e in Event.objects.filter(run=run, seq__gt=expired).order_by("seq")]


def test_an_expired_instance_that_held_nothing_is_released_in_one_event_naming_both_states(acme):
    run, token = leased_run(acme.worker)
    expire(run)
    assert leases_reap().leases == 1
    assert LeaseGrant.objects.get(run=run).state == "EXPIRED"

    result = resources_reap()

    assert result.instances_released == 1
    assert LeaseGrant.objects.get(run=run).state == "RELEASED"
    assert after_the_lease(run) == [
        (
            "INSTANCE_RELEASED",
            {"fencing_token": token, "from": "EXPIRED", "to": "RELEASED", "cleanup": "nothing held"},
        )
    ]
    assert_chain_intact(run.pk)
    assert resources_reap().instances_released == 0  # nothing moves twice


def test_an_expired_instance_whose_resources_were_closed_records_reaping_then_verified_cleanup(acme, sandbox_driver):
    run, token = leased_run(acme.worker)
    resource, _ = resource_attach(
        worker=acme.worker,
        run_id=run.pk,
        fencing_token=token,
        attach=Attach(kind="connection", provider="sandbox", handle="held-then-closed"),
    )
    resource_release(worker=acme.worker, resource_id=resource.pk, fencing_token=token)
    assert resources_reap().released == 1  # closed by its driver while the lease was held
    expire(run)
    assert leases_reap().leases == 1

    assert resources_reap().instances_released == 1

    assert LeaseGrant.objects.get(run=run).state == "RELEASED"
    assert sandbox_driver.is_closed("sandbox", "held-then-closed")
    assert [(kind, fields) for kind, fields in after_the_lease(run) if kind.startswith("INSTANCE_")] == [
        ("INSTANCE_REAPING", {"fencing_token": token}),
        ("INSTANCE_RELEASED", {"fencing_token": token, "cleanup": "verified"}),
    ]
    assert_chain_intact(run.pk)
