"""The published schema says exactly what the server accepts and answers (issue 11, item 6;
issue 35, item 11).

Schemathesis reads ``/api/v1/openapi.json`` from the live test server and sends what it
generates from it, valid and invalid, with every check on: no 500, every status and body
documented, valid data accepted, invalid data refused. Two bounded runs, about two minutes
together on 2 cores:

* the deterministic phases (examples and coverage: every schema's boundary values, valid and
  invalid, for every operation), seeded;
* the random phases for a fixed time: fuzzing, then the stateful phase (sequences of calls,
  with the links the schema declares from each id to the calls that take it) with a worker of
  its own that the run never drains, stops or boots (``STATEFUL_EXCLUDED``): once it has,
  every new run answers 409 and no sequence gets past its first step. Those three calls are
  fuzzed with the rest.

A check that could not hold would be listed in ``EXCLUDED`` with its reason; there is none.
One kind of failure is dropped and counted (tests/api/schemathesis_hooks.py): a schema-valid
body refused 422 FORBIDDEN_FIELD by the secret boundary, whose rule JSON Schema cannot state.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.services.fleet.workers import worker_create
from ledger.services.tenancy.tenants import tenant_ensure

# Checks excluded, each with its reason. None today: every check runs. (State-dependent
# refusals of schema-valid bodies, a random run_id's 404 or a random token's 409, are
# among the statuses schemathesis expects for valid data.)
EXCLUDED: dict[str, str] = {}
# The worker's own lifecycle: after a drain, an exit or a failing boot report it takes no new run.
STATEFUL_EXCLUDED = r"^/api/v1/workers/me/(drain|exit|boots)$"
MAX_EXAMPLES = 10
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def schemathesis(url: str, token: str, cwd: Path, report: str, *args: str) -> str:
    """Run ``st run`` against ``url`` with every check on; the whole report is kept in
    test-artifacts/``report`` for a person to read. Returns its output after asserting no failure."""
    st = Path(sys.executable).with_name("st")
    command = [
        str(st),
        "run",
        f"{url}/api/v1/openapi.json",
        "--checks",
        "all",
        *(["--exclude-checks", ",".join(sorted(EXCLUDED))] if EXCLUDED else []),
        "--header",
        f"Authorization: Bearer {token}",
        "--workers",
        "2",
        "--no-color",
        *args,
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd, env=env, check=False)
    output = result.stdout + result.stderr
    counted = cwd / "boundary-refusals.txt"
    refusals = len(counted.read_text().splitlines()) if counted.exists() else 0
    output += f"\nRefused by the secret boundary (FORBIDDEN_FIELD, not counted as failures): {refusals}\n"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / report).write_text(output)
    assert result.returncode == 0, output[-12000:]
    assert "generated" in output and " failed" not in output, output[-4000:]
    return output


def worker_token(name: str) -> str:
    tenant, _ = tenant_ensure(slug="schemathesis")
    _, token = worker_create(tenant=tenant, name=name)
    return token


@pytest.mark.slow
def test_schemathesis_finds_no_mismatch_between_schema_and_server(live_server, db, tmp_path):
    # The coverage phase is deterministic: every schema's boundary values, valid and invalid,
    # for every operation (~1,200 requests, about 30 s).
    schemathesis(
        live_server.url,
        worker_token("schemathesis"),
        tmp_path,
        "schemathesis.txt",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        "11",
        "--generation-deterministic",
        "--phases",
        "examples,coverage",
        "--max-time",
        "240",
    )


@pytest.mark.slow
def test_schemathesis_fuzzing_and_stateful_phases_find_no_mismatch(live_server, db, tmp_path):
    fuzzed = schemathesis(
        live_server.url,
        worker_token("schemathesis-fuzz"),
        tmp_path,
        "schemathesis-fuzzing.txt",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        "35",
        "--phases",
        "fuzzing",
        "--max-time",
        "20",
    )
    assert "Fuzzing" in fuzzed
    stateful = schemathesis(
        live_server.url,
        worker_token("schemathesis-stateful"),
        tmp_path,
        "schemathesis-stateful.txt",
        "--seed",
        "35",
        "--phases",
        "stateful",
        "--exclude-path-regex",
        STATEFUL_EXCLUDED,
        "--max-time",
        "30",
    )
    assert "Scenarios:" in stateful
