"""The one parser of request bodies: a JSON object, unambiguous, and storable as sent.

* Not JSON, not an object, ``NaN``/``Infinity``, or a key twice in one object:
  400 MALFORMED_JSON. With a duplicate key, two parsers could disagree on which value
  was authorized (RFC 8259 leaves it open), so neither is taken.
* Anything PostgreSQL would refuse or change (``ledger.storable``: NUL, lone surrogates,
  ``-0.0``, floats of 1e16 and more), in any field at any depth: 422 VALIDATION_ERROR
  naming the field. This runs before the schemas, for every body of every endpoint, so a
  new field cannot bring back a 500.
* Any key or string that looks like a credential, alone or together with the body's other
  strings (a key split across two fields): 422 FORBIDDEN_FIELD naming the field
  (``ledger.boundary.check_request``). Every field of every endpoint passes the secret
  boundary here, whatever its service checks after.

Ninja wraps whatever the parser raises in a 400 ``HttpError``; ``ledger/api/errors.py``
answers with the domain error behind it.
"""

import json
from typing import Any

from django.http import HttpRequest
from ninja.parser import Parser

from ledger.boundary import check_request, path_segment
from ledger.errors import InvalidInput, MalformedJSON
from ledger.storable import storage_problem


def _refuse_constant(name: str) -> Any:
    raise MalformedJSON(f"{name} is not JSON")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedJSON(f"the key {path_segment(key)!r} appears twice in one object")
            seen.add(key)
    return obj


def parse_json_object(raw: bytes | str) -> dict[str, Any]:
    """The body as a dict, or MalformedJSON / InvalidInput (nothing is echoed but key names)."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant, object_pairs_hook=_object_without_duplicates)
    except MalformedJSON:
        raise
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        raise MalformedJSON("the request body must be a JSON object") from None
    if not isinstance(data, dict):
        raise MalformedJSON("the request body must be a JSON object")
    problem = storage_problem(data, segment=path_segment)
    if problem is not None:
        field, reason = problem
        raise InvalidInput(f"{field}: {reason}", field=field)
    check_request(data)
    return data


class StrictJSONParser(Parser):
    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        return parse_json_object(request.body)
