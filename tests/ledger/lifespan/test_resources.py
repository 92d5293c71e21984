"""The resource registry over HTTP (issue 12, item 5): attach and release under the fence,
counted against the run's quota, a live handle in one place only, hostile input refused
naming the field with nothing stored."""

import pytest
from django.utils import timezone

from ledger.models import Event, RunLease, RunResource
from ledger.services.authority.policy import policy_change
from tests.factories import make_worker
from tests.helpers import assert_chain_intact, database_fingerprint


def attach(client, run_id, handle, token=1, **extra):
    body = {"fencing_token": token, "kind": "browser_session", "provider": "sandbox", "handle": handle, **extra}
    return client.post(f"/runs/{run_id}/resources", body)


def test_a_worker_attaches_and_releases_a_resource_and_only_the_reaper_releases_it(leased):
    client, run_id = leased
    r = attach(client, run_id, "sess-1", ttl_s=600, idle_s=120)
    assert r.status == 201, r
    assert (r.body["state"], r.body["kind"], r.body["idle_s"]) == ("ACTIVE", "browser_session", 120)
    again = attach(client, run_id, "sess-1", ttl_s=600, idle_s=120)
    assert (again.status, again.body["resource_id"]) == (200, r.body["resource_id"])  # idempotent

    released = client.post(f"/resources/{r.body['resource_id']}/release", {"fencing_token": 1})
    assert (released.status, released.body["state"]) == (200, "RELEASE_REQUESTED"), released
    assert client.get(f"/resources/{r.body['resource_id']}").body["state"] == "RELEASE_REQUESTED"
    types = [e.type for e in assert_chain_intact(run_id)]
    assert types[-2:] == ["RESOURCE_ATTACHED", "RESOURCE_RELEASE_REQUESTED"]
    attached = Event.objects.get(run_id=run_id, type="RESOURCE_ATTACHED")
    assert (attached.fields["handle"], attached.fields["kind"]) == ("sess-1", "browser_session")


def test_a_stale_owner_can_neither_attach_nor_release(leased, api_for):
    client, run_id = leased
    resource = attach(client, run_id, "sess-old").body["resource_id"]
    RunLease.objects.filter(run_id=run_id).update(expires_at=timezone.now())
    assert api_for(make_worker("acme", "worker-2")).acquire(run_id, "worker-b").status == 200
    assert attach(client, run_id, "sess-new").body["error"] == "STALE_TOKEN"
    refused = client.post(f"/resources/{resource}/release", {"fencing_token": 1})
    assert refused.body["error"] == "STALE_TOKEN"
    # The takeover handed the old instance's session to the reaper.
    assert RunResource.objects.get(pk=resource).state == "RELEASE_REQUESTED"


def test_a_handle_live_in_one_tenant_cannot_be_attached_by_another_or_by_another_run(leased, api_for, acme, outsider):
    client, run_id = leased
    assert attach(client, run_id, "sess-shared").status == 201
    intruder = api_for(outsider)
    other_run = intruder.create_run()
    assert intruder.acquire(other_run, "x").status == 200
    before = database_fingerprint()
    refused = attach(intruder, other_run, "sess-shared")
    assert database_fingerprint() == before  # refused, and nothing written
    assert (refused.status, refused.body["error"]) == (409, "RESOURCE_IN_USE"), refused
    assert "acme" not in refused.raw.text and run_id not in refused.raw.text  # names nothing of the other tenant
    same_tenant_run = client.create_run()
    assert client.acquire(same_tenant_run, "worker-a").status == 200
    assert attach(client, same_tenant_run, "sess-shared").body["error"] == "RESOURCE_IN_USE"
    assert intruder.get(f"/resources/{RunResource.objects.get(handle='sess-shared').pk}").status == 404


def test_the_run_resource_quota_is_counted_per_kind(leased, acme):
    client, run_id = leased
    policy_change(
        tenant=acme.tenant,
        document={"quotas": {"resources_per_run": {"browser_session": 2, "*": 5}}},
        reason="two browsers per run",
        changed_by="admin",
    )
    assert attach(client, run_id, "b-1").status == 201
    assert attach(client, run_id, "b-2").status == 201
    refused = attach(client, run_id, "b-3")
    assert refused.status == 403, refused
    assert (refused.body["error"], refused.body["quota"], refused.body["limit"], refused.body["use"]) == (
        "DENY_QUOTA",
        "resources_per_run.browser_session",
        2,
        2,
    )
    assert attach(client, run_id, "c-1", kind="connection").status == 201  # other kinds: the "*" limit
    # A released resource still counts until the reaper confirmed it closed.
    first = RunResource.objects.get(handle="b-1").pk
    assert client.post(f"/resources/{first}/release", {"fencing_token": 1}).status == 200
    assert attach(client, run_id, "b-3").status == 403
    RunResource.objects.filter(pk=first).update(state="RELEASED")
    assert attach(client, run_id, "b-3").status == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kind": "teleporter"}, "kind"),
        ({"kind": 3}, "kind"),
        ({"provider": ""}, "provider"),
        ({"provider": "has space"}, "provider"),
        ({"handle": ""}, "handle"),
        ({"handle": "x" * 501}, "handle"),
        ({"handle": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"}, "handle"),
        ({"handle": "https://u:hunter2hunter2@example.com/s"}, "handle"),
        ({"provider": "sk_live_" + "51HxQ2aLkT9vW3mZr8YbC4dN7pJ6sF0g"}, "provider"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"idle_s": "60"}, "idle_s"),
        ({"extra": 1}, "extra"),  # an unknown key that reads as a field name is named
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_stored(leased, change, field):
    client, run_id = leased
    before = database_fingerprint()
    body = {"fencing_token": 1, "kind": "browser_session", "provider": "sandbox", "handle": "ok-1", **change}
    r = client.post(f"/runs/{run_id}/resources", body)
    assert r.status == 422, r
    assert (
        field in {problem["field"].split(".")[0] for problem in r.body.get("fields", [])} or r.body.get("path") == field
    ), r
    assert database_fingerprint() == before


def test_a_secret_looking_tool_name_on_acquire_is_refused_and_nothing_is_stored(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    before = database_fingerprint()
    canary = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    r = client.post(f"/runs/{run_id}/lease", {"owner_id": "worker-a", "ttl_s": 30, "tool": canary})
    assert (r.status, r.body["error"], r.body["path"]) == (422, "FORBIDDEN_FIELD", "tool"), r
    assert canary not in r.raw.text
    assert database_fingerprint() == before
