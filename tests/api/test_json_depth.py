"""A body nested deeper than JSON_MAX_DEPTH (64 levels, the body being level 1) is refused at
the parser with 422 naming the limit and the field, on every endpoint that takes a body, at any
depth up to what fits in 1 MiB: never a 500 (a RecursionError of a walk after the parser), and
nothing is written. A body at the limit is taken, stored and verified."""

import json
import uuid

import pytest
import requests
from django.conf import settings

from ledger.models import Event, Run, WorkerBoot
from ledger.models.lifespan import ProgressCheckpoint
from ledger.services.evidence.verification import run_verify

DEPTHS = (65, 950, 9_999, 100_000)


def nested(levels: int, key: str | None) -> str:
    """A JSON value ``levels`` levels deep: objects under ``key``, or arrays with key None."""
    if key is None:
        return "[" * levels + "]" * levels
    return f'{{"{key}":' * (levels - 1) + "{}" + "}" * (levels - 1)


def snapshot() -> tuple[int, ...]:
    return Run.objects.count(), Event.objects.count(), ProgressCheckpoint.objects.count(), WorkerBoot.objects.count()


@pytest.fixture
def setting_up(api_for, acme):
    """acme's client, a run it leases (token 1) and an operation of it, and the published schema."""
    client = api_for(acme)
    run_id = client.leased_run()
    op_id = client.intend(run_id, 1, "depth").body["operation_id"]
    schema = requests.get(client.base + "/openapi.json", timeout=10).json()
    return client, run_id, op_id, schema


def body_paths(schema: dict, run_id: str, op_id: str) -> list[tuple[str, str]]:
    """Every (path, first body field) of the API that takes a JSON body, with real ids."""
    found = []
    for template, methods in schema["paths"].items():
        for method, spec in methods.items():
            if method != "post" or "requestBody" not in spec:
                continue
            ref = spec["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
            first = next(iter(schema["components"]["schemas"][ref]["properties"]))
            path = template.removeprefix("/api/v1")
            path = path.replace("{run_id}", run_id).replace("{operation_id}", op_id)
            path = path.replace("{resource_id}", str(uuid.uuid4())).replace("{lease_id}", str(uuid.uuid4()))
            assert "{" not in path, path
            found.append((path, first))
    return found


def assert_refused_for_depth(r, field_prefix: str) -> None:
    limit = settings.FENCELINE["JSON_MAX_DEPTH"]
    assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), r
    assert r.body["limit"] == limit
    assert f"nested deeper than {limit} levels" in r.body["detail"]
    field = r.body["fields"][0]["field"]
    assert field.startswith(field_prefix), field
    assert len(field.split(".")) == limit  # the path down to the first level past the limit


@pytest.mark.parametrize("levels", DEPTHS)
def test_a_body_too_deep_is_refused_naming_the_limit_on_every_endpoint(setting_up, levels):
    client, run_id, op_id, schema = setting_up
    paths = body_paths(schema, run_id, op_id)
    assert len(paths) >= 15, paths
    before = snapshot()
    for path, field in paths:
        for key in ("a", None):
            r = client.post(path, raw=f'{{"{field}": {nested(levels, key)}}}'.encode())
            assert_refused_for_depth(r, f"{field}.")
    assert snapshot() == before


@pytest.mark.parametrize("levels", DEPTHS)
def test_deep_event_fields_checkpoint_state_and_boot_evidence_are_refused(setting_up, levels):
    client, run_id, _, _ = setting_up
    before = snapshot()
    r = client.post(
        f"/runs/{run_id}/events",
        raw=f'{{"fencing_token": 1, "type": "NOTE", "fields": {nested(levels, "x")}}}'.encode(),
    )
    assert_refused_for_depth(r, "fields.x.x")
    state = nested(levels, "s")
    r = client.post(
        f"/runs/{run_id}/checkpoints", raw=f'{{"fencing_token": 1, "position": "p", "state": {state}}}'.encode()
    )
    assert_refused_for_depth(r, "state.s.s")
    evidence = nested(levels, None)
    readiness = f'{{"runtime": {{"ok": true, "evidence": {{"e": {evidence}}}}}}}'
    boot = f'{{"boot_id": "b", "config_hash": "c", "code_version": "v", "state_schema_version": 1, "pid": 1, "host": "h", "readiness": {readiness}}}'
    r = client.post("/workers/me/boots", raw=boot.encode())
    assert_refused_for_depth(r, "readiness.runtime.evidence.e.0.0")
    assert snapshot() == before


def test_an_event_at_the_limit_is_stored_and_its_chain_verifies(setting_up):
    client, run_id, _, _ = setting_up
    limit = settings.FENCELINE["JSON_MAX_DEPTH"]
    fields = json.loads(nested(limit - 1, "x"))  # the body is level 1
    r = client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": fields})
    assert r.status == 201, r
    stored = Event.objects.get(run_id=run_id, seq=r.body["seq"])
    assert stored.fields == fields
    report = run_verify(run_id=run_id, seal=False)
    assert report.finding is None, report


def test_brackets_inside_strings_do_not_count_as_depth(setting_up):
    client, run_id, _, _ = setting_up
    text = "[" * 5000 + '{"' + "\\" * 3 + '"'
    r = client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"note": text}})
    assert r.status == 201, r
