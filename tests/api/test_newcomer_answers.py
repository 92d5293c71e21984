"""What a newcomer's first calls get (issue 40): POST /runs without ``schema_version`` takes
the current one; a call copying that key is refused naming it; a NOTE after the run completed
says RUN_COMPLETED, not a stale token."""

from ledger.models import Event, Run
from ledger.versioning import CURRENT_SCHEMA_VERSION


def test_a_run_is_created_without_a_schema_version_at_the_current_one(api_for, acme):
    client = api_for(acme)
    r = client.post("/runs", {})
    assert r.status == 201, r
    assert Run.objects.get(pk=r.body["run_id"]).schema_version == CURRENT_SCHEMA_VERSION
    assert client.post("/runs", {"schema_version": 99}).body["error"] == "UNKNOWN_SCHEMA_VERSION"


def test_a_lease_call_carrying_schema_version_is_refused_naming_the_key(api_for, acme):
    client = api_for(acme)
    run_id = client.create_run()
    r = client.post(f"/runs/{run_id}/lease", {"schema_version": 1, "owner_id": "a", "ttl_s": 30})
    assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), r
    assert r.body["fields"][0]["field"] == "schema_version"
    assert "'schema_version' is not a field this call takes" in r.body["detail"]


def test_a_note_after_the_run_completed_answers_run_completed(api_for, acme):
    client = api_for(acme)
    run_id = client.leased_run()
    assert client.post(f"/runs/{run_id}/complete", {"fencing_token": 1}).status == 200
    events = Event.objects.filter(run_id=run_id).count()
    r = client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"said": "late"}})
    assert (r.status, r.body["error"]) == (409, "RUN_COMPLETED"), r
    assert Event.objects.filter(run_id=run_id).count() == events  # nothing added to a finished chain
    assert Run.objects.get(pk=run_id).stale_rejections == 0
