"""One JSON line per request and per job, read as the bytes the configured handler prints:
the fields operators filter on are there, and a canary smuggled in through the request id,
the path, a header or a job's failure never is."""

import io
import json
import logging

import pytest

from ledger import tasks
from ledger.services.fence.leases import ReapResult
from tests.factories import leased_run

pytestmark = pytest.mark.django_db

# A well-formed AWS access key id: it looks like a request id too.
CANARY_KEY_ID = "AKIA" + "QX7TEST4CANARY2Z"


@pytest.fixture
def printed():
    """Everything the root handler (console/settings.py LOGGING) prints, as bytes."""
    handler = next(h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler))
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield lambda: stream.getvalue().encode()
    handler.setStream(previous)


def json_lines(data: bytes, logger: str) -> list[dict]:
    lines = [json.loads(line) for line in data.decode().splitlines() if line.startswith("{")]
    return [line for line in lines if line["logger"] == logger]


def test_each_request_is_one_json_line_with_the_ids_operators_filter_on(client, acme, printed):
    run, token = leased_run(acme.worker)
    answer = client.post(
        f"/api/v1/runs/{run.pk}/lease/renew",
        {"owner_id": "someone-else", "fencing_token": token, "ttl_s": 30},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {acme.token}",
        HTTP_X_REQUEST_ID="trace-42",
    )
    assert answer.status_code == 409 and answer["X-Request-ID"] == "trace-42"
    (line,) = json_lines(printed(), "fenceline.request")
    assert line["request_id"] == "trace-42"
    assert (line["method"], line["route"], line["status"], line["code"]) == (
        "POST",
        "api/v1/runs/<run_id>/lease/renew",
        409,
        "LEASE_LOST",
    )
    assert (line["tenant"], line["worker"], line["run"], line["operation"]) == ("acme", "worker-1", str(run.pk), "")
    assert line["duration_ms"] >= 0 and line["time"].endswith("+00:00")
    assert acme.token not in printed().decode()


def test_a_canary_in_the_request_id_the_path_or_a_header_never_reaches_the_log_bytes(client, acme, printed):
    answer = client.get("/api/v1/runs/00000000-0000-0000-0000-000000000000", HTTP_X_REQUEST_ID=CANARY_KEY_ID)
    assert answer["X-Request-ID"] != CANARY_KEY_ID  # a credential-like id is replaced, not echoed
    client.get(f"/api/v1/runs/{CANARY_KEY_ID}", HTTP_AUTHORIZATION=f"Bearer {CANARY_KEY_ID}")
    client.get(f"/runs/?q={CANARY_KEY_ID}")
    data = printed()
    assert len(json_lines(data, "fenceline.request")) == 3
    for form in (CANARY_KEY_ID, CANARY_KEY_ID.lower(), CANARY_KEY_ID[4:]):
        assert form.encode() not in data


def test_each_job_run_is_one_json_line_and_a_failure_keeps_only_the_exceptions_type(monkeypatch, printed):
    monkeypatch.setattr(tasks, "leases_reap", lambda: ReapResult(leases=2, operations=1, batches=1))
    tasks.reap_leases_task.apply().get()

    def broken():
        raise ValueError(f"cannot reach the vault with {CANARY_KEY_ID}")

    monkeypatch.setattr(tasks, "leases_reap", broken)
    with pytest.raises(ValueError, match="vault"):
        tasks.reap_leases_task.apply().get()
    finished, failed = json_lines(printed(), "fenceline.job")
    assert finished["job"] == "reap-leases" and finished["outcome"] == "ok"
    assert finished["counts"] == {"leases": 2, "operations": 1, "batches": 1} and finished["duration_ms"] >= 0
    assert (failed["outcome"], failed["error"]) == ("failed", "ValueError")
    assert CANARY_KEY_ID.encode() not in printed()
