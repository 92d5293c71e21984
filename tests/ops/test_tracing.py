"""Issue 38, item 4: trace context end to end. A call's W3C traceparent is kept on the
operation it intends and in every chain event it writes (an optional field: chains verify
with and without it); an invalid one is ignored; the Python client sends the worker's
OpenTelemetry context (or a traceparent it was given); with tracing configured, API requests
and Celery jobs make spans that continue the caller's trace (an in-memory exporter, in a
process of its own so the instrumentation stays out of the other tests)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from opentelemetry.sdk.trace import TracerProvider

from fenceline_client import client as fl
from ledger.models import Event, Operation
from ledger.observability.tracing import trace_id_of
from ledger.services.evidence.verification import ledger_verify

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
ROOT = Path(__file__).resolve().parents[2]


def _post(client, token, path, body, traceparent=None):
    headers = {"Authorization": f"Bearer {token}"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    return client.post(f"/api/v1{path}", body, content_type="application/json", headers=headers)


@pytest.mark.parametrize(
    "header, expected",
    [
        (TRACEPARENT, TRACE),
        (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", ""),  # upper-case hex is not a traceparent
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""),  # the all-zero trace id
        ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", ""),  # 31 digits
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""),  # version ff is invalid
        ("", ""),
        (None, ""),
    ],
)
def test_only_a_valid_traceparent_gives_a_trace_id(header, expected):
    assert trace_id_of(header) == expected


@pytest.mark.django_db
def test_a_calls_trace_id_is_kept_on_its_operation_and_in_the_events_it_writes(client, acme):
    run = _post(client, acme.token, "/runs", {"schema_version": 1}, TRACEPARENT).json()["run_id"]
    lease = _post(client, acme.token, f"/runs/{run}/lease", {"owner_id": "w", "ttl_s": 30}, TRACEPARENT).json()
    fenced = {"fencing_token": lease["fencing_token"]}
    intent = {"tool": "email", "action": "send", "resource": "mailto:a@example.com", "effect_class": "IDEMPOTENT"}
    traced = _post(client, acme.token, f"/runs/{run}/operations", {**fenced, **intent, "idempotency_key": "t-1"},
                   TRACEPARENT)  # fmt: skip
    assert traced.status_code == 201, traced.json()
    bad = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
    ignored = _post(client, acme.token, f"/runs/{run}/operations", {**fenced, **intent, "idempotency_key": "t-2"}, bad)
    assert ignored.status_code == 201, ignored.json()  # an invalid traceparent is ignored, not refused
    plain = _post(client, acme.token, f"/runs/{run}/events", {**fenced, "type": "NOTE", "fields": {"n": 1}})
    assert plain.status_code == 201

    operation = Operation.objects.get(pk=traced.json()["operation_id"])
    assert operation.trace_id == TRACE
    assert Operation.objects.get(pk=ignored.json()["operation_id"]).trace_id == ""
    read = client.get(f"/api/v1/operations/{operation.pk}", headers={"Authorization": f"Bearer {acme.token}"})
    assert read.json()["trace_id"] == TRACE
    events = {e.type + ":" + str(e.seq): e.fields for e in Event.objects.filter(run_id=run).order_by("seq")}
    with_trace = [key for key, fields in events.items() if fields.get("trace_id") == TRACE]
    without = [key for key, fields in events.items() if "trace_id" not in fields]
    assert {key.split(":")[0] for key in with_trace} == {"RUN_CREATED", "LEASE_ACQUIRED", "OPERATION_PLANNED"}
    assert [key.split(":")[0] for key in without] == ["OPERATION_PLANNED", "NOTE"]
    verified = ledger_verify(run_ids=[run])
    assert (verified.runs, verified.broken) == (1, 0)


def test_the_python_client_sends_the_workers_trace_context(live_server, acme, transactional_db):
    worker = fl.Client(live_server.url, acme.token, traceparent=TRACEPARENT)
    run_id = worker.create_run()
    with worker.lease(run_id, ttl_s=30) as lease:
        lease.operation(tool="email", action="send", resource="mailto:b@example.com", effect_class="IDEMPOTENT",
                        idempotency_key="c-1", perform=lambda: fl.Done(provider_request_id="m-1"))  # fmt: skip
        # The worker's own OpenTelemetry span wins over the fixed traceparent.
        tracer = TracerProvider().get_tracer("worker")
        with tracer.start_as_current_span("charge") as span:
            own = format(span.get_span_context().trace_id, "032x")
            lease.operation(tool="email", action="send", resource="mailto:c@example.com", effect_class="IDEMPOTENT",
                            idempotency_key="c-2", perform=lambda: fl.Done(provider_request_id="m-2"))  # fmt: skip
        lease.complete()
    assert Operation.objects.get(idempotency_key="c-1").trace_id == TRACE
    assert Operation.objects.get(idempotency_key="c-2").trace_id == own != TRACE
    outcome = Event.objects.get(run_id=run_id, type="OPERATION_CONFIRMED", fields__operation_id__isnull=False,
                                fields__trace_id=own)  # fmt: skip
    assert outcome.fields["trace_id"] == own
    assert fl.new_traceparent() != fl.new_traceparent() and trace_id_of(fl.new_traceparent())


SPANS_SCRIPT = """
import json, os, sys
import django
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ledger.observability.tracing import setup_tracing
exporter = InMemorySpanExporter()
provider = setup_tracing(exporter)
django.setup()
from django.test import Client
answer = Client().get("/healthz", headers={"traceparent": sys.argv[1]})
assert answer.status_code == 200, answer.status_code
canary = Client().get("/api/v1/runs/ghp_" + "Zq8rT4wX9yB2cD6eF1gH3jK5mN7pQ0sV2uW4?key=sk_live_9f8e7d6c5b4a39281706f5e4", headers={"traceparent": sys.argv[1]})
assert canary.status_code in (401, 404, 422), canary.status_code
from ledger.tasks import count_run_totals_task
count_run_totals_task.apply()
provider.force_flush()
print(json.dumps([
    {"name": s.name, "trace_id": format(s.context.trace_id, "032x"), "attributes": dict(s.attributes),
     "parent": format(s.parent.span_id, "016x") if s.parent else None, "kind": s.kind.name}
    for s in exporter.get_finished_spans()
]))
"""


@pytest.mark.django_db(transaction=True)
def test_requests_and_jobs_make_spans_that_continue_the_callers_trace():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/" + connection.settings_dict["NAME"],
        "DJANGO_ALLOWED_HOSTS": "testserver",
    }
    done = subprocess.run([sys.executable, "-c", SPANS_SCRIPT, TRACEPARENT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    spans = json.loads(done.stdout.strip().splitlines()[-1])
    server = [s for s in spans if s["kind"] == "SERVER"]
    assert len(server) == 2 and all(s["trace_id"] == TRACE and s["parent"] == "00f067aa0ba902b7" for s in server)
    # Neither the path nor the query of a request reaches a span: the credential-like canaries
    # (refused by the URL boundary) appear nowhere in what would be exported.
    exported = json.dumps(spans)
    assert "Zq8rT4wX9yB2cD6eF1gH3jK5mN7pQ0sV2uW4" not in exported and "sk_live_9f8e7d6c5b4a39281706f5e4" not in exported
    jobs = [s for s in spans if s["kind"] == "CONSUMER" or "count_run_totals" in s["name"]]
    assert jobs, spans
