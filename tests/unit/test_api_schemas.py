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
