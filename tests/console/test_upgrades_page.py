"""The upgrades page for each role: everyone with a role sees the changes, their tenants'
worker builds and open state conflicts; only an operator of the conflict's tenant decides
it, with a reason, and never by a default; only an admin allows effects after a restore.
Another tenant's conflict is a 404; a bad form is a 422 that changes nothing."""

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.models import AdminAction, Event, Run, StateConflict, Tenant, Worker
from ledger.services.upgrades.restore import effects_hold
from ledger.states import ConflictStatus
from tests.factories import booted, state_conflict, worker_in
from tests.helpers import Browser

pytestmark = pytest.mark.django_db


def test_everyone_with_a_role_sees_the_conflicts_of_their_tenants_only(acme, outsider, viewer):
    mine, theirs = state_conflict(acme), state_conflict(outsider, "c-2")
    viewer = Browser(viewer)
    page = viewer.get(reverse("upgrades"))
    assert page.status_code == 200
    html = page.content.decode()
    assert f"conflict-{mine.pk}" in html and f"conflict-{theirs.pk}" not in html
    assert "operation.provider_ref" in html and "EXPAND" in html
    assert "an operator decides" in html  # a viewer gets no form
    assert "shown to platform admins" in html  # cross-tenant backfill counts are not a viewer's
    run_page = viewer.get(reverse("run_detail", args=[mine.run_id])).content.decode()
    assert "automation stopped" in run_page and "STATE_CONFLICT" in run_page


def test_an_operator_decides_a_conflict_with_a_reason(acme, outsider, operator):
    conflict = state_conflict(acme)
    operator = Browser(operator)
    url = reverse("upgrades-conflict-resolve", args=[conflict.pk])
    before = Event.objects.count()
    for bad in ({"choice": "old"}, {"choice": "whichever", "reason": "x"}, {"reason": "no choice"}):
        answer = operator.post(url, bad)
        assert answer.status_code == 422, bad
    assert Event.objects.count() == before
    assert StateConflict.objects.get(pk=conflict.pk).status == ConflictStatus.OPEN

    other = state_conflict(outsider, "c-2")
    assert (
        operator.post(
            reverse("upgrades-conflict-resolve", args=[other.pk]), {"choice": "old", "reason": "x"}
        ).status_code
        == 404
    )

    answer = operator.post(url, {"choice": "old", "reason": "the provider shows ch_2"}, follow=True)
    assert answer.status_code == 200
    assert "provider_request_id kept" in answer.content.decode()
    conflict.refresh_from_db()
    assert (conflict.status, conflict.resolution, conflict.resolved_by) == ("RESOLVED", "old", "olga")
    assert Run.objects.get(pk=conflict.run_id).open_conflicts == 0
    assert Event.objects.filter(run_id=conflict.run_id, type="STATE_CONFLICT_RESOLVED", actor="user:olga").exists()


@pytest.mark.parametrize("role", ["viewer", "approver"])
def test_a_role_without_operate_cannot_decide(acme, role, people):
    conflict = state_conflict(acme)
    person = Browser(people[role])
    answer = person.post(reverse("upgrades-conflict-resolve", args=[conflict.pk]), {"choice": "new", "reason": "x"})
    assert answer.status_code == 403
    assert StateConflict.objects.get(pk=conflict.pk).status == ConflictStatus.OPEN


def test_only_an_admin_allows_effects_after_a_restore(acme, outsider, operator, admin):
    effects_hold(by="restore_check", tenants=["acme", "globex"], reason="restored from last night's backup")
    url = reverse("upgrades-allow-effects", args=["acme"])
    operator = Browser(operator)
    assert "an admin of acme decides" in operator.get(reverse("upgrades")).content.decode()
    assert operator.post(url, {"reason": "looked"}).status_code == 403
    admin = Browser(admin)
    assert admin.post(reverse("upgrades-allow-effects", args=["globex"]), {"reason": "x"}).status_code == 404
    assert admin.post(url, {"reason": " "}).status_code == 422
    assert Tenant.objects.get(slug="acme").effects_held
    answer = admin.post(url, {"reason": "chains verified, UNKNOWN effects checked"}, follow=True)
    assert "Effects allowed for acme" in answer.content.decode()
    assert not Tenant.objects.get(slug="acme").effects_held
    assert Tenant.objects.get(slug="globex").effects_held  # the other tenant stays held
    assert AdminAction.objects.filter(action="tenant.effects_allow", actor="ada").exists()


def test_the_banner_counts_only_booted_workers_behind_and_names_the_unreported_apart(acme, viewer):
    silent = worker_in(acme.tenant, "ACTIVE", "never-booted")
    reporting = worker_in(acme.tenant, "ACTIVE", "booted")
    booted(reporting, reads=1)
    Worker.objects.filter(pk__in=[silent.pk, reporting.pk, acme.worker.pk]).update(last_seen_at=timezone.now())
    body = Browser(viewer).get(reverse("upgrades")).content.decode()
    assert "cannot read v1" not in body  # nobody booted is behind what is written
    assert "2 live workers have not sent a boot report" in body
