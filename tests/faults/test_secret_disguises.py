"""The secret boundary under disguise (issue 35, item 1): one probe matrix over the worker API.

Each disguise class of ``tests/faults/secret_probes.py`` goes into every free-text field of
every endpoint that takes text; afterwards no probe's credential is in any row of any table or
in any printed log line, raw or disguised.
"""

import os

import pytest

from tests.factories import make_worker
from tests.faults import secret_probes as sp


@pytest.fixture
def printed_logs():
    logs = sp.PrintedLogs()
    yield logs
    logs.close()


@pytest.fixture
def new_worker(db):
    made = []

    def build() -> sp.Worker:
        made.append(make_worker("acme", f"probe-{len(made)}"))
        return sp.Worker(made[-1].token)

    return build


def test_measure_every_class_in_every_field(new_worker, printed_logs):
    """The measurement: FENCELINE_PROBES_PER_CLASS probes (default 1) of each class in each field."""
    per_class = int(os.environ.get("FENCELINE_PROBES_PER_CLASS", "1"))
    probes = sp.send_probes(new_worker, per_class)
    table = sp.tally(probes, sp.database_text(), printed_logs.text())
    print("\n" + sp.render(table))
    leaked = {name: (row.stored, row.logged) for name, row in table.items() if row.stored or row.logged}
    assert leaked == {}


def test_every_probed_field_stores_ordinary_text(new_worker, printed_logs):
    """The fields are live: an ordinary unique marker in each is accepted and stored."""
    worker = new_worker()
    markers = {}
    for name, (send, _) in sp.FIELDS.items():
        if name.startswith("url."):
            continue
        marker = f"marker-{sp.core()[2:14].lower()}"
        w = new_worker() if name in sp.FRESH_WORKER else worker
        status, body = send(w, marker, None)
        assert status in (200, 201), (name, status, body)
        markers[name] = marker
    stored = sp.database_text().lower()
    assert [name for name, marker in markers.items() if marker not in stored] == []
