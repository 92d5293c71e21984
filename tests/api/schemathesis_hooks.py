"""Schemathesis hooks for tests/api/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

One kind of "schema-valid request rejected" is not a mismatch: 422 FORBIDDEN_FIELD, the secret
boundary refusing a generated key or value that reads as a credential ("pWd" inside a random
key is a password's key). The schema states that rule in words ("no credential-like key or
value", ledger/boundary/) but cannot in JSON Schema: the boundary judges normal forms,
confusable letters and the words of a key. Those failures, and only those, are dropped; each
is counted in ``boundary-refusals.txt`` beside the run so the test can report how many. Every
other failure, of every check, fails the run."""

import json
from pathlib import Path

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

COUNTED = Path("boundary-refusals.txt")


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 422:
        return True
    try:
        code = json.loads(response.content).get("error")
    except (ValueError, AttributeError):
        return True
    if code != "FORBIDDEN_FIELD":
        return True
    with COUNTED.open("a") as counted:
        counted.write(f"{case.method} {case.path}\n")
    return False
