"""The provider_ref change's rules, held against each other: the dual read in Python
(``agrees``) and in SQL (``AGREES_SQL``, the backfill's) say the same of every record, and
what a writer stores in each phase keeps the two representations agreeing."""

import json

import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.services.upgrades.provider_ref import (
    NEW,
    OLD,
    ProviderRef,
    agrees,
    disagreement,
    reference,
    version_for_new,
    written,
)
from ledger.sql.upgrades import AGREES_SQL
from ledger.states import UpgradePhase

pytestmark = pytest.mark.django_db

# Text PostgreSQL stores (no NUL), short enough to collide often.
text = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=3)
ids = st.sampled_from(["", "ch_1", "ch_2", "é"]) | text
providers = st.sampled_from(["", "stripe", "github"]) | text
json_scalars = st.none() | st.booleans() | st.integers(-3, 3) | ids
refs = st.one_of(
    st.none(),
    st.builds(lambda p, i: {"provider": p, "id": i}, providers, ids),
    st.builds(lambda i: {"id": i}, ids),
    st.dictionaries(st.sampled_from(["provider", "id", "extra"]), json_scalars, max_size=3),
    json_scalars,
    st.lists(ids, max_size=2),
)


def sql_agrees(*, schema_version: int, provider: str, provider_request_id: str, provider_ref: object) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {AGREES_SQL} FROM (SELECT %s::int AS schema_version, %s::text AS provider, "  # noqa: S608
            "%s::text AS provider_request_id, %s::jsonb AS provider_ref) o",
            [schema_version, provider, provider_request_id, None if provider_ref is None else json.dumps(provider_ref)],
        )
        return cursor.fetchone()[0]


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from([OLD, NEW]), provider=providers, old=ids, ref=refs)
def test_the_python_and_the_sql_dual_read_agree_on_every_record(version, provider, old, ref):
    record = {"schema_version": version, "provider": provider, "provider_request_id": old, "provider_ref": ref}
    assert agrees(**record) == sql_agrees(**record), record


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"schema_version": 1, "provider": "stripe", "provider_request_id": "ch_1", "provider_ref": None}, True),
        ({"schema_version": 2, "provider": "stripe", "provider_request_id": "ch_1", "provider_ref": None}, False),
        ({"schema_version": 2, "provider": "", "provider_request_id": "", "provider_ref": None}, True),
        # An empty object: every comparison in SQL is NULL; it must read as disagreeing.
        ({"schema_version": 1, "provider": "", "provider_request_id": "", "provider_ref": {}}, False),
        (
            {
                "schema_version": 2,
                "provider": "stripe",
                "provider_request_id": "ch_1",
                "provider_ref": {"provider": "stripe", "id": "ch_1"},
            },
            True,
        ),
        (
            {
                "schema_version": 1,
                "provider": "stripe",
                "provider_request_id": "ch_2",
                "provider_ref": {"provider": "stripe", "id": "ch_1"},
            },
            False,
        ),
        (
            {
                "schema_version": 2,
                "provider": "stripe",
                "provider_request_id": "ch_1",
                "provider_ref": {"provider": "github", "id": "ch_1"},
            },
            False,
        ),
    ],
)
def test_named_records(record, expected):
    assert agrees(**record) is expected
    assert sql_agrees(**record) is expected


@pytest.mark.parametrize("phase", list(UpgradePhase))
@pytest.mark.parametrize("ref", [None, ProviderRef(provider="stripe", id="ch_9")])
def test_what_each_phase_writes_reads_back_as_it_was_written(phase, ref):
    stored = written(phase, provider="stripe", ref=ref)
    if phase == UpgradePhase.CONTRACT:
        assert stored["provider_request_id"] == ""  # the old column is no longer written
    else:
        assert stored["provider_request_id"] == (ref.id if ref else "")  # dual-write
        assert agrees(provider="stripe", **stored)
    assert stored["schema_version"] == (OLD if phase == UpgradePhase.EXPAND else NEW)

    class Record:
        pk = "op"
        provider = "stripe"

    record = Record()
    record.__dict__.update(stored)
    assert disagreement(record, phase) is None
    assert reference(record, phase) == ref


def test_new_records_take_the_version_of_their_phase():
    assert version_for_new(UpgradePhase.EXPAND) == OLD
    assert version_for_new(UpgradePhase.MIGRATE) == NEW
    assert version_for_new(UpgradePhase.CONTRACT) == NEW
