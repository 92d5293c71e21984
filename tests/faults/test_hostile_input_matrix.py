"""Hostile input, generated from the API's own schemas (issue 11).

For every POST endpoint with a body, a valid body is built from its published request schema
(``/api/v1/openapi.json``); then every string field (and every string item of an array) gets a
NUL character, a lone surrogate and one character more than its maxLength, and every integer
field one beyond its minimum and its maximum. Each request must answer 4xx with the API's error
body naming exactly that field, and leave every row of every table as it was.

A field added to a schema joins the matrix by itself; ``tests/unit/test_api_schemas.py`` makes
sure it has bounds to be tested against.
"""

import copy
import json

import pytest

from ledger.api import api
from ledger.models import Event, Operation, RunLease
from tests.helpers import database_fingerprint

DOCUMENT = api.get_openapi_schema()
COMPONENTS = DOCUMENT["components"]["schemas"]
# Values the generator cannot guess from a schema: patterns with one fixed spelling.
EXAMPLES = {"type": "NOTE", "error_code": "E_TIMEOUT", "args_digest": "sha256:ab"}


def _resolve(schema: dict) -> dict:
    if "$ref" in schema:
        return COMPONENTS[schema["$ref"].rsplit("/", 1)[1]]
    options = [o for o in schema.get("anyOf", []) if o.get("type") != "null"]
    return _resolve(options[0]) if options else schema


def example(schema: dict, name: str = ""):
    """A valid value of ``schema`` (every property, optional ones too)."""
    schema = _resolve(schema)
    if name in EXAMPLES:
        return EXAMPLES[name]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties")
        if properties is None:
            return {"step": "fetch", "n": 1}
        return {key: example(child, key) for key, child in properties.items()}
    if kind == "array":
        return [example(schema["items"], name)]
    if kind == "integer":
        return max(schema.get("minimum", 0), 1)
    if kind == "boolean":
        return True
    if schema.get("format") == "date-time":
        return "2026-12-04T05:00:00+00:00"
    return "a"


def leaves(schema: dict, path: tuple = ()):
    """(path, leaf schema) of every string and integer in a body of ``schema``."""
    schema = _resolve(schema)
    kind = schema.get("type")
    if kind == "object":
        for key, child in schema.get("properties", {}).items():
            yield from leaves(child, (*path, key))
    elif kind == "array":
        yield from leaves(schema["items"], (*path, 0))
    elif kind in ("string", "integer"):
        yield path, schema


def mutations(schema: dict):
    for path, leaf in leaves(schema):
        if leaf["type"] == "string" and "enum" not in leaf:
            yield path, "NUL", "a\x00b"
            yield path, "lone surrogate", "a\ud800b"
            yield path, "one over maxLength", "a" * (leaf["maxLength"] + 1)
        if leaf["type"] == "integer" and "enum" not in leaf:
            yield path, "above maximum", leaf["maximum"] + 1
            yield path, "below minimum", leaf["minimum"] - 1


def endpoints():
    for route, methods in DOCUMENT["paths"].items():
        body = methods.get("post", {}).get("requestBody")
        if body:
            yield route.removeprefix("/api/v1"), body["content"]["application/json"]["schema"]


CASES = [
    pytest.param(route, path, what, value, id=f"{route} {'.'.join(map(str, path))} {what}")
    for route, schema in endpoints()
    for path, what, value in mutations(schema)
]


def _set(body: dict, path: tuple, value) -> dict:
    body = copy.deepcopy(body)
    target = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return body


@pytest.fixture
def world(api_for, acme):
    """A leased run (token 1) with one authorized operation and one resource: every path has
    something to name."""
    client = api_for(acme)
    run_id = client.create_run()
    assert client.acquire(run_id, "worker-a").status == 200
    op_id = client.intend(run_id, 1, "existing").body["operation_id"]
    assert client.authorize(op_id, 1).status == 200
    resource = client.post(
        f"/runs/{run_id}/resources", {"fencing_token": 1, "kind": "sandbox", "provider": "sandbox", "handle": "sb-1"}
    )
    assert resource.status == 201, resource
    return client, {"run_id": run_id, "operation_id": op_id, "resource_id": resource.body["resource_id"]}


def test_the_matrix_covers_every_body_endpoint_and_field_kind():
    routes = {case.values[0] for case in CASES}
    assert len(routes) == len(list(endpoints())) >= 14
    kinds = {case.values[2] for case in CASES}
    assert kinds == {"NUL", "lone surrogate", "one over maxLength", "above maximum", "below minimum"}
    assert len(CASES) > 100


@pytest.mark.parametrize("route, path, what, value", CASES)
def test_hostile_field_is_refused_by_name_and_writes_nothing(world, route, path, what, value):
    client, ids = world
    schema = dict(endpoints())[route]
    body = _set(example(schema), path, value)
    before = database_fingerprint()
    r = client.post(route.format(**ids), raw=json.dumps(body).encode())
    assert 400 <= r.status < 500, r
    assert r.body["error"] == "VALIDATION_ERROR", r
    assert [problem["field"] for problem in r.body["fields"]] == [".".join(map(str, path))], r
    assert database_fingerprint() == before


@pytest.mark.parametrize(
    "value, problem",
    [
        ({"a": "x\x00y"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        ({"deep": [{"x": "\udfff"}]}, "surrogate"),
        ({"n": 1e16}, "1e16"),
        ({"n": -1.5e300}, "1e16"),
        ({"n": -0.0}, "-0.0"),
    ],
)
def test_event_fields_that_storage_would_change_are_refused_at_any_depth(world, value, problem):
    client, ids = world
    before = database_fingerprint()
    r = client.post(
        f"/runs/{ids['run_id']}/events", raw=json.dumps({"fencing_token": 1, "type": "NOTE", "fields": value}).encode()
    )
    assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), r
    assert r.body["fields"][0]["field"].startswith("fields."), r
    assert problem in r.body["detail"]
    assert database_fingerprint() == before


@pytest.mark.parametrize(
    "raw",
    [
        b'{"fencing_token": 1, "fencing_token": 2}',
        b'{"fencing_token": 1, "type": "NOTE", "fields": {"a": 1, "a": 2}}',
    ],
)
def test_a_duplicate_key_is_malformed_json(world, raw):
    client, ids = world
    before = database_fingerprint()
    r = client.post(f"/runs/{ids['run_id']}/events", raw=raw)
    assert (r.status, r.body["error"]) == (400, "MALFORMED_JSON"), r
    assert database_fingerprint() == before


def test_a_body_over_the_upload_limit_is_413(world, settings):
    client, ids = world
    before = database_fingerprint()
    padding = "n" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    r = client.post(f"/runs/{ids['run_id']}/events", {"fencing_token": 1, "type": "NOTE", "fields": {"p": padding}})
    assert (r.status, r.body["error"]) == (413, "PAYLOAD_TOO_LARGE"), r
    assert database_fingerprint() == before


def test_integral_floats_are_integers_as_the_schema_says(world):
    client, ids = world
    r = client.post(f"/runs/{ids['run_id']}/lease/renew", {"owner_id": "worker-a", "fencing_token": 1.0, "ttl_s": 60.0})
    assert r.status == 200, r
    op = client.intend(ids["run_id"], 1, "floats", estimated_cost_cents=250.0, payload_bytes=1e3).body
    assert Operation.objects.get(pk=op["operation_id"]).estimated_cost_cents == 250
    for bad in (1.5, True, "60"):
        r = client.post(
            f"/runs/{ids['run_id']}/lease/renew", {"owner_id": "worker-a", "fencing_token": 1, "ttl_s": bad}
        )
        assert (r.status, r.body["fields"][0]["field"]) == (422, "ttl_s"), r
    assert RunLease.objects.get(run_id=ids["run_id"]).fencing_token == 1


def test_floats_that_round_trip_are_kept_exactly(world):
    client, ids = world
    fields = {"small": 1e-7, "tiny": 5e-324, "big": 9.999999999999998e15, "one": 1.0, "pi": 3.141592653589793}
    r = client.post(f"/runs/{ids['run_id']}/events", {"fencing_token": 1, "type": "NOTE", "fields": fields})
    assert r.status == 201, r
    stored = Event.objects.get(run_id=ids["run_id"], seq=r.body["seq"]).fields
    assert json.dumps(stored, sort_keys=True) == json.dumps(fields, sort_keys=True)
