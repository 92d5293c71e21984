"""The activity feed's selector (ledger/activity.py): every chain event and admin record of
the tenants a user sees and nothing of any other, narrowed by who, kind, tenant, type and
time; keyset pages that stay put when new activity arrives, in both directions, with chain
events and admin records in one order even at the same moment."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.activity import ActivityFilters, activity_page
from ledger.models import AdminAction, Event
from ledger.services.core.decisions import admin_action_record
from tests.factories import new_run, user_with

pytestmark = pytest.mark.django_db


def _all(user, filters=None, size=50):
    """Every entry the user sees, read page by page (newest first)."""
    filters = filters or ActivityFilters()
    page = activity_page(user=user, filters=filters, size=size)
    seen = list(page.rows)
    while page.next_cursor:
        page = activity_page(user=user, filters=filters, cursor=page.next_cursor, size=size)
        seen.extend(page.rows)
    return seen


def _keys(rows):
    return [(row.source, row.id) for row in rows]


def test_a_user_sees_only_the_events_and_records_of_their_tenants(acme, outsider, viewer, outsider_admin):
    mine, theirs = new_run(acme.worker), new_run(outsider.worker)
    admin_action_record(tenant=acme.tenant, actor="user:ada", action="policy.change", subject="acme", reason="r1")
    admin_action_record(tenant=outsider.tenant, actor="user:gus", action="policy.change", subject="globex", reason="r2")

    seen = _all(viewer)
    assert {row.tenant for row in seen} == {"acme"}
    assert mine.pk in {row.run_id for row in seen}
    assert theirs.pk not in {row.run_id for row in seen}
    assert "r1" in {row.reason for row in seen} and "r2" not in {row.reason for row in seen}
    # ... also when asking for the other tenant by name, or for its admin's actions
    assert _all(viewer, ActivityFilters(tenant="globex")) == []
    assert _all(viewer, ActivityFilters(who="gus")) == []
    assert {row.tenant for row in _all(outsider_admin)} == {"globex"}


def test_a_user_with_no_role_sees_nothing(acme):
    new_run(acme.worker)
    admin_action_record(tenant=acme.tenant, actor="user:ada", action="policy.change", subject="acme", reason="r")
    assert _all(user_with(None, acme.tenant, "nobody")) == []


def test_a_superuser_sees_every_tenant(acme, outsider, django_user_model):
    new_run(acme.worker), new_run(outsider.worker)
    root = django_user_model.objects.create_superuser("root", password="x")
    assert {row.tenant for row in _all(root)} == {"acme", "globex"}


def test_filters_by_person_kind_type_tenant_and_time(acme, admin):
    run = new_run(acme.worker)
    now = timezone.now()
    admin_action_record(tenant=acme.tenant, actor="user:ada", action="worker.drain", subject="w", reason="drain it")
    admin_action_record(
        tenant=acme.tenant, actor="system:drain", action="worker.quarantine", subject="w", reason="restarts"
    )
    old = admin_action_record(
        tenant=acme.tenant,
        actor="user:ada",
        action="policy.change",
        subject="acme",
        reason="old",
        now=now - timedelta(days=3),
    )

    assert {row.type for row in _all(admin, ActivityFilters(who="ada"))} == {"worker.drain", "policy.change"}
    assert {row.actor for row in _all(admin, ActivityFilters(kind="job"))} == {"system:drain"}
    assert {row.type for row in _all(admin, ActivityFilters(type="RUN_CREATED"))} == {"RUN_CREATED"}
    assert {row.run_id for row in _all(admin, ActivityFilters(kind="worker"))} == {run.pk}
    assert [row.type for row in _all(admin, ActivityFilters(type="worker.drain"))] == ["worker.drain"]
    recent = _all(admin, ActivityFilters(since=now - timedelta(hours=1)))
    assert old.pk not in {row.id for row in recent if row.source == "action"}
    assert [row.id for row in _all(admin, ActivityFilters(until=now - timedelta(days=1)))] == [old.pk]
    # a worker named without its lease owner matches each of its owners' events
    assert {row.run_id for row in _all(admin, ActivityFilters(who="worker:worker-1"))} == {run.pk}
    assert _all(admin, ActivityFilters(who="worker:worker")) == []


def _same_moment_history(acme, count=7):
    """Events and admin records, several at one same moment, for the order's tie-breaks."""
    run = new_run(acme.worker)
    moment = timezone.now() - timedelta(minutes=5)
    events = Event.objects.bulk_create(
        [
            Event(
                run=run,
                seq=100 + i,
                type="NOTE",
                actor="worker:worker-1/a",
                occurred_at=moment,
                prev_hash="sha256:" + "0" * 64,
                hash="sha256:" + "1" * 64,
            )
            for i in range(count)
        ]
    )
    actions = [
        admin_action_record(
            tenant=acme.tenant, actor="user:ada", action="policy.change", subject="x", reason=f"{i}", now=moment
        )
        for i in range(count)
    ]
    return events, actions


def test_pages_hold_every_entry_once_even_at_one_moment(acme, admin):
    _same_moment_history(acme)
    everything = _all(admin, size=100)
    for size in (1, 2, 3, 5):
        assert _keys(_all(admin, size=size)) == _keys(everything)
    assert len(set(_keys(everything))) == len(everything)


def test_previous_pages_are_the_pages_already_seen_after_new_activity(acme, admin):
    _same_moment_history(acme)
    filters = ActivityFilters()
    first = activity_page(user=admin, filters=filters, size=4)
    second = activity_page(user=admin, filters=filters, cursor=first.next_cursor, size=4)
    third = activity_page(user=admin, filters=filters, cursor=second.next_cursor, size=4)
    assert first.prev_cursor is None and second.prev_cursor and third.prev_cursor

    # New activity arrives at the top of the list while the reader is on page three.
    new_run(acme.worker)
    admin_action_record(tenant=acme.tenant, actor="user:ada", action="role.grant", subject="y", reason="new")

    back_to_second = activity_page(user=admin, filters=filters, back=third.prev_cursor, size=4)
    assert _keys(back_to_second.rows) == _keys(second.rows)
    back_to_first = activity_page(user=admin, filters=filters, back=back_to_second.prev_cursor, size=4)
    assert _keys(back_to_first.rows) == _keys(first.rows)
    assert back_to_first.prev_cursor is not None  # the new activity is before it now
    forward_again = activity_page(user=admin, filters=filters, cursor=back_to_first.next_cursor, size=4)
    assert _keys(forward_again.rows) == _keys(second.rows)
    newest = activity_page(user=admin, filters=filters, back=back_to_first.prev_cursor, size=4)
    assert {row.type for row in newest.rows} >= {"RUN_CREATED", "role.grant"} and newest.prev_cursor is None


def test_a_cursor_that_is_not_ours_reads_the_first_page(acme, admin):
    new_run(acme.worker)
    first = activity_page(user=admin, filters=ActivityFilters())
    for junk in ("nonsense", "eyJ4Ijo", "WyIyMDI2LTEyLTA2VDAwOjAwOjAwIiwgIjktOSJd"):
        assert _keys(activity_page(user=admin, filters=ActivityFilters(), cursor=junk).rows) == _keys(first.rows)
        assert _keys(activity_page(user=admin, filters=ActivityFilters(), back=junk).rows) == _keys(first.rows)


def test_admin_records_and_events_interleave_newest_first(acme, admin):
    run = new_run(acme.worker)
    action = admin_action_record(tenant=acme.tenant, actor="user:ada", action="policy.change", subject="x", reason="r")
    rows = _all(admin)
    assert (rows[0].source, rows[0].id) == ("action", action.pk)
    moments = [r.occurred_at for r in rows]
    assert moments == sorted(moments, reverse=True)
    assert AdminAction.objects.count() == 1 and Event.objects.filter(run=run).exists()
