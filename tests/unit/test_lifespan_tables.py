"""The lifespan state tables say what the services rely on (ledger/states.py): cleanup is
verified before RELEASED, a finished run never moves again, a resource never skips the
reaper, and the sets the services filter on are derived from the tables."""

from ledger.states import (
    CANCEL_ENDS,
    INSTANCE_LIVE,
    INSTANCE_TRANSITIONS,
    RESOURCE_CLAIMABLE,
    RESOURCE_MARKABLE,
    RESOURCE_TRANSITIONS,
    RUN_FINISHED,
    RUN_TRANSITIONS,
    InstanceState,
    ResourceState,
    RunStatus,
    instance_sources,
)


def test_an_expired_instance_reaches_released_only_through_reaping():
    assert InstanceState.RELEASED not in INSTANCE_TRANSITIONS[InstanceState.EXPIRED]
    assert INSTANCE_TRANSITIONS[InstanceState.REAPING] == {InstanceState.RELEASED}
    assert INSTANCE_TRANSITIONS[InstanceState.RELEASED] == frozenset()


def test_every_held_instance_can_be_lost_and_given_up():
    held = INSTANCE_LIVE - {InstanceState.ALLOCATED}  # allocation and acquisition are one step
    for target in (InstanceState.EXPIRED, InstanceState.REAPING, InstanceState.RELEASED):
        assert held <= set(instance_sources(target)), target


def test_a_run_ends_once_and_a_cancellation_ends_only_cancelled_or_timed_out():
    for status in RUN_FINISHED:
        assert RUN_TRANSITIONS[status] == frozenset()
    assert RUN_TRANSITIONS[RunStatus.CANCELLING] == frozenset(CANCEL_ENDS)
    assert RunStatus.COMPLETED not in RUN_TRANSITIONS[RunStatus.CANCELLING]


def test_a_resource_never_skips_the_reaper_and_the_service_sets_come_from_the_table():
    assert RESOURCE_TRANSITIONS[ResourceState.ACTIVE] == {ResourceState.RELEASE_REQUESTED}
    assert RESOURCE_TRANSITIONS[ResourceState.RELEASED] == frozenset()
    assert set(RESOURCE_CLAIMABLE) == {ResourceState.RELEASE_REQUESTED, ResourceState.CLEANUP_FAILED}
    assert ResourceState.ACTIVE not in RESOURCE_MARKABLE  # a person marks only what is on its way out
