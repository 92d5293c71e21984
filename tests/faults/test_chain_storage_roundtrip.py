"""No false tamper alarm (issue 11, item 2): whatever JSON a worker appends, an event that
is accepted reads back from PostgreSQL as the document that was hashed, and its chain verifies.

The property runs arbitrary JSON values (floats at every magnitude, -0.0, NaN, NUL, lone
surrogates, nested objects) through what the API does with a body: the body parser, then
``event_append`` under the fence. Each value is either refused with a 4xx domain error, or
stored, read back from the database and verified with the verifier the console and the jobs
use. Before the fix, ``{"n": 1e16}`` was stored as ``10000000000000000`` and the run read BROKEN.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.api.body import parse_json_object
from ledger.chain import event_document, event_hash
from ledger.errors import DomainError
from ledger.models import Event
from ledger.services.evidence.verification import run_verify
from ledger.services.fence.notes import event_append
from tests.factories import leased_run

EDGE_FLOATS = st.sampled_from(
    [1e16, -1e16, 9.999999999999998e15, 1e300, -0.0, 0.0, 5e-324, 1e-7, 2.5, float("nan"), float("inf")]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | EDGE_FLOATS
    | st.text(max_size=12)
    | st.sampled_from(["a\x00b", "\ud800", "x\udfffy", "\u200b", "é"])
)
KEYS = st.text(max_size=8) | st.sampled_from(["k\x00", "\ud83d", "n"])
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=12,
)


@pytest.fixture
def held_run(acme):
    """acme's worker, a run whose lease it holds, and the token: (worker, run id, token)."""
    run, token = leased_run(acme.worker, owner="prop", ttl_s=3600)
    return acme.worker, run.pk, token


def append_as_the_api_does(worker, run_id, token, fields) -> Event | None:
    """What POST /runs/{id}/events does with this body: None when it is refused (4xx)."""
    raw = json.dumps({"fencing_token": token, "type": "NOTE", "fields": fields})
    try:
        body = parse_json_object(raw)
        return event_append(worker=worker, run_id=run_id, fencing_token=token, type="NOTE", fields=body["fields"])
    except DomainError as refusal:
        assert 400 <= refusal.status < 500
        return None


@settings(
    max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=st.dictionaries(KEYS, JSON_VALUES, max_size=4))
def test_an_accepted_event_reads_back_as_hashed_and_verifies(held_run, fields):
    worker, run_id, token = held_run
    event = append_as_the_api_does(worker, run_id, token, fields)
    if event is None:
        return
    stored = Event.objects.get(pk=event.pk)  # as PostgreSQL's jsonb gives it back
    assert event_hash(event_document(stored)) == stored.hash
    report = run_verify(run_id=run_id, seal=False)
    assert report.finding is None, report.finding


@pytest.mark.parametrize(
    "value",
    [{"n": 1e16}, {"n": -0.0}, {"n": 1.5e300}, {"deep": [{"n": -1e17}]}, {"s": "\x00"}, {"s": "\ud800"}, {"\x00": 1}],
)
def test_values_storage_would_change_are_refused_not_stored(held_run, value):
    worker, run_id, token = held_run
    assert append_as_the_api_does(worker, run_id, token, value) is None
    assert not Event.objects.filter(run_id=run_id, type="NOTE").exists()


def test_values_that_round_trip_are_accepted_and_verify(held_run):
    worker, run_id, token = held_run
    value = {"n": 9.999999999999998e15, "tiny": 5e-324, "one": 1.0, "zero": 0.0, "big_int": 10**30, "text": "é\u200b"}
    event = append_as_the_api_does(worker, run_id, token, value)
    assert event is not None
    assert Event.objects.get(pk=event.pk).fields == value
    assert run_verify(run_id=run_id, seal=False).finding is None
