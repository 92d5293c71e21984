"""The worker API's request schemas: literals that are the enums, and a bound on every field
read from its column, so that no value can reach the database that the column refuses."""

from typing import get_args

import pytest

from ledger.api import api
from ledger.api.columns import JSON_SAFE_INTEGER, integer_range
from ledger.api.schemas import EffectClassName, OutcomeName
from ledger.models import CapabilityBudget, Operation, Run, RunLease
from ledger.states import EffectClass, Outcome

pytestmark = pytest.mark.django_db(databases=[])


def test_the_literals_of_the_request_schemas_are_the_enums():
    assert list(get_args(EffectClassName)) == EffectClass.values
    assert list(get_args(OutcomeName)) == Outcome.values


def _leaves(schema: dict, path: str, components: dict):
    """(path, schema) of every scalar a request body can hold."""
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    for option in schema.get("anyOf", []):
        if option.get("type") != "null":
            yield from _leaves(option, path, components)
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        for name, child in schema["properties"].items():
            yield from _leaves(child, f"{path}.{name}", components)
    elif kind == "array":
        yield from _leaves(schema["items"], f"{path}.0", components)
    elif kind in ("string", "integer", "number", "boolean"):
        yield path, schema


def request_schemas():
    document = api.get_openapi_schema()
    components = document["components"]["schemas"]
    for route, methods in document["paths"].items():
        for method, operation in methods.items():
            body = operation.get("requestBody")
            if body:
                yield f"{method.upper()} {route}", body["content"]["application/json"]["schema"], components


def test_every_request_field_is_bounded():
    unbounded = []
    for where, schema, components in request_schemas():
        for path, leaf in _leaves(schema, "", components):
            if leaf["type"] == "string" and "maxLength" not in leaf and "enum" not in leaf:
                unbounded.append(f"{where} {path}: string without maxLength")
            if leaf["type"] == "integer" and not ("minimum" in leaf and "maximum" in leaf):
                unbounded.append(f"{where} {path}: integer without minimum and maximum")
            if leaf["type"] == "number":
                unbounded.append(f"{where} {path}: a float field")
    assert unbounded == []


@pytest.mark.parametrize(
    "model, name, expected",
    [
        (Operation, "payload_bytes", (0, 2**31 - 1)),  # PositiveIntegerField
        (CapabilityBudget, "max_bytes", (-JSON_SAFE_INTEGER, JSON_SAFE_INTEGER)),  # BigIntegerField, JSON-safe
        (RunLease, "fencing_token", (-JSON_SAFE_INTEGER, JSON_SAFE_INTEGER)),
        (Run, "schema_version", (0, 32767)),  # PositiveSmallIntegerField
    ],
)
def test_integer_bounds_come_from_the_column_type(model, name, expected):
    assert integer_range(model, name) == expected


def test_the_published_reason_pattern_refuses_exactly_the_reasons_the_services_refuse():
    import re

    from ledger.errors import InvalidInput
    from ledger.services.core.decisions import decision_reason

    components = api.get_openapi_schema()["components"]["schemas"]
    pattern = components["CancelIn"]["properties"]["reason"]["pattern"]
    assert components["DrainIn"]["properties"]["reason"]["anyOf"][0]["pattern"] == pattern
    published = re.compile(pattern)
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # not storable: refused by the body parser first
        text = chr(code) * 2
        try:
            decision_reason(text)
            accepted = True
        except InvalidInput:
            accepted = False
        assert bool(published.search(text)) == accepted or "\x00" in text, hex(code)


def test_every_answer_that_carries_an_id_links_to_the_calls_that_take_it():
    document = api.get_openapi_schema()
    created = document["paths"]["/api/v1/runs"]["post"]["responses"][201]["links"]
    lease = created["ledger_api_acquire_lease.run_id"]
    assert lease == {"operationId": "ledger_api_acquire_lease", "parameters": {"run_id": "$response.body#/run_id"}}
    intent = document["paths"]["/api/v1/runs/{run_id}/operations"]["post"]["responses"][201]["links"]
    assert "ledger_api_authorize_operation.operation_id" in intent
    operation_ids = {op["operationId"] for ops in document["paths"].values() for op in ops.values()}
    for ops in document["paths"].values():
        for op in ops.values():
            for answer in op["responses"].values():
                for link in answer.get("links", {}).values():
                    assert link["operationId"] in operation_ids
