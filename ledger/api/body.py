"""The one parser of request bodies: a JSON object, unambiguous, and storable as sent.

* Not JSON, not an object, ``NaN``/``Infinity``, or a key twice in one object:
  400 MALFORMED_JSON. With a duplicate key, two parsers could disagree on which value
  was authorized (RFC 8259 leaves it open), so neither is taken.
* Nested deeper than ``JSON_MAX_DEPTH`` (64) objects and arrays, the body itself being level
  1: 422 VALIDATION_ERROR naming the limit and the field. The depth is read from the text in
  one pass without recursion (:func:`nesting_problem`) before the parser or anything that
  walks the value recursively (the secret boundary, the schemas, canonical JSON) sees it.
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

import itertools
import json
import re
from typing import Any

from django.conf import settings
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


# What nesting depends on in a JSON text: a whole string (brackets inside it are text), an
# opening or closing bracket, a colon or a comma. Anything else (numbers, literals, blanks)
# opens or closes nothing.
_NESTING_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.DOTALL)


def _key_segment(token: bytes) -> str:
    try:
        key = json.loads(token)
    except ValueError:
        return "*"
    return path_segment(key) if isinstance(key, str) else "*"


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Each opening bracket as the signed byte 1, each closing one as -1; everything else dropped.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_A_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))


def _deeper_than(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` nests deeper than ``limit``, at the speed of C: the running sum of the
    brackets outside strings (+1 opening, -1 closing) never goes above the limit."""
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return False
    steps = _STRING.sub(b"", raw).translate(_STEPS, _NOT_A_BRACKET)
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0) > limit


def nesting_problem(raw: bytes, limit: int) -> str | None:
    """The dotted path of the first object or array in the JSON text ``raw`` that lies deeper
    than ``limit`` levels (the outermost value is level 1), or None. No recursion, whatever the
    depth: a check at C speed, then (only for a text too deep) one pass with a stack of the
    open levels to name where."""
    if not _deeper_than(raw, limit):
        return None
    slots: list[bytes | int | None] = []  # per open level: its current key (object) or index (array)
    expect_key = False
    for match in _NESTING_TOKEN.finditer(raw):
        token = match.group()
        head = token[:1]
        if head in (b"{", b"["):
            if len(slots) == limit:
                return ".".join(_key_segment(s) if isinstance(s, bytes) else str(s) for s in slots if s is not None)
            slots.append(None if head == b"{" else 0)
            expect_key = head == b"{"
        elif head in (b"}", b"]"):
            if slots:
                slots.pop()
            expect_key = False
        elif head == b",":
            top = slots[-1] if slots else None
            if isinstance(top, int):
                slots[-1] = top + 1
            expect_key = not isinstance(top, int)
        elif head == b":":
            expect_key = False
        elif expect_key:  # a string where an object's key belongs
            slots[-1] = token
    return None


def parse_json_object(raw: bytes | str) -> dict[str, Any]:
    """The body as a dict, or MalformedJSON / InvalidInput (nothing is echoed but key names)."""
    limit: int = settings.FENCELINE["JSON_MAX_DEPTH"]
    deep = nesting_problem(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw, limit)
    if deep is not None:
        field = deep or "body"
        raise InvalidInput(f"{field}: nested deeper than {limit} levels (the limit)", field=field, limit=limit)
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
