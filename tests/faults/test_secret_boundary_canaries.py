"""The secret-boundary article's leak matrix, over real HTTP.

Each row smuggles its own canary through one path a secret takes in an agent runtime:
tool arguments, a provider error, a retry payload, a child tool's output, an exception
raised while a request is handled, a browser snapshot. The request is refused with the
documented code, and afterwards the canary is nowhere: not in the response bytes, not in
any row of any table (every table is searched, so new tables are covered), and not in
what the configured log handlers printed, at DEBUG level. A refused request also writes
nothing at all: no event, no operation change, no stale-write count.
"""

import io
import logging
from dataclasses import dataclass

import pytest
from django.db import connection

import console.views.dashboard
from ledger.services.fence import notes
from tests.helpers import database_fingerprint, tables_containing

# --- where a canary could end up ----------------------------------------------------------


def text_columns() -> set[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND data_type IN ('text', 'character varying', 'character', 'json', 'jsonb')"
        )
        return set(cursor.fetchall())


class LogSink:
    """What the configured handlers print, and every record at DEBUG and above."""

    def __init__(self, caplog):
        self.caplog = caplog
        loggers = [logging.getLogger()] + [
            logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
        ]
        self.handlers = [
            handler
            for logger in loggers
            for handler in logger.handlers
            if not type(handler).__module__.startswith("_pytest")
        ]
        assert self.handlers, "console/settings.py LOGGING installs handlers"
        self.printed = io.StringIO()
        self._streams = [
            (handler, handler.setStream(self.printed))
            for handler in self.handlers
            if isinstance(handler, logging.StreamHandler)
        ]

    def close(self) -> None:
        for handler, stream in self._streams:
            handler.setStream(stream)

    def text(self) -> str:
        parts = [self.printed.getvalue(), self.caplog.text]
        for record in self.caplog.records:
            parts.append(record.getMessage())
            for handler in self.handlers:
                if handler.filter(record):
                    parts.append(handler.format(record))
        return "\n".join(parts)


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.DEBUG)  # the root logger: everything that propagates
    sink = LogSink(caplog)
    yield sink
    sink.close()


def assert_nowhere(canary: str, response, logs: LogSink) -> None:
    assert canary.lower() not in response.raw.content.decode("utf-8", "replace").lower(), "canary in the response"
    assert tables_containing(canary) == [], "canary in the database"
    assert canary.lower() not in logs.text().lower(), "canary in a log line"


# --- a run with a dispatched operation ------------------------------------------------------


@dataclass
class Leased:
    client: object
    run_id: str
    op_id: str

    def event(self, type: str, fields: dict):
        return self.client.post(f"/runs/{self.run_id}/events", {"fencing_token": 1, "type": type, "fields": fields})


@pytest.fixture
def leased(api_for, acme, logs):
    client = api_for(acme)
    run_id = client.leased_run()
    op_id = client.intend(run_id, 1, "send-report-1").body["operation_id"]
    assert client.authorize(op_id, 1).status == 200
    assert client.dispatch(op_id, 1).body == {"phase": "DISPATCHED", "reservation_id": None, "levers": None}
    return Leased(client, run_id, op_id)


def refused(response, status: int, code: str, path: str | None = None) -> None:
    assert (response.status, response.body["error"]) == (status, code), response
    if path is not None:
        assert response.body["path"] == path, response
        assert path in response.body["detail"]


# --- the matrix -----------------------------------------------------------------------------


# (a) tool arguments


def test_tool_arguments_in_a_note_are_refused(leased, logs):
    canary = "CANARY_ARG_4f1c"
    before = database_fingerprint()
    r = leased.event("NOTE", {"tool_name": "github.create_issue", "args": {"title": "t", "authorization": canary}})
    refused(r, 422, "FORBIDDEN_FIELD", "fields.args.authorization")
    assert r.body["rule"] == "forbidden key"
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_raw_tool_arguments_in_a_worker_event_are_refused(leased, logs):
    canary = "CANARY_ARG_7a20"
    before = database_fingerprint()
    r = leased.event("x.tool.call", {"tool_name": "search", "args": {"query": canary}})
    refused(r, 422, "FORBIDDEN_FIELD", "fields.args")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_an_intent_carrying_its_arguments_is_refused(leased, logs):
    canary = "CANARY_ARG_91d3"
    before = database_fingerprint()
    r = leased.client.intend(leased.run_id, 1, "send-report-2", args={"to": "ops", "api_key": canary})
    refused(r, 422, "VALIDATION_ERROR")
    assert [p["field"] for p in r.body["fields"]] == ["args"]  # an unknown key named; its value never echoed
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


# (b) provider error


def test_an_outcome_carrying_the_provider_error_message_is_refused(leased, logs):
    canary = "CANARY_ERR_456a"
    before = database_fingerprint()
    r = leased.client.outcome(
        leased.op_id, 1, "FAILED", error_code="E_UPSTREAM_401", error_message=f"401: key {canary} revoked"
    )
    refused(r, 422, "VALIDATION_ERROR")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_a_note_with_the_raw_provider_error_is_refused(leased, logs):
    canary = "CANARY_ERR_b71e"
    before = database_fingerprint()
    r = leased.event("NOTE", {"error_code": "E_UPSTREAM_401", "error_message": f"Unauthorized: {canary}"})
    refused(r, 422, "FORBIDDEN_FIELD", "fields.error_message")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_a_credential_echoed_as_provider_request_id_rolls_the_outcome_back(leased, logs):
    canary = "CANARY_ERR_c0de"
    before = database_fingerprint()
    r = leased.client.outcome(leased.op_id, 1, "UNKNOWN", provider_request_id=f"Bearer {canary}")
    refused(r, 422, "FORBIDDEN_FIELD", "provider_request_id")
    assert r.body["rule"] == "credential-like value"
    assert database_fingerprint() == before  # still DISPATCHED, no case, no event
    assert_nowhere(canary, r, logs)


def test_a_fenced_report_carrying_a_credential_is_refused_and_not_counted(leased, logs):
    canary = "CANARY_ERR_5a1e"
    before = database_fingerprint()
    # A stale token would be counted and its provider request id kept as unverified
    # evidence; a credential-like one stops the whole transaction instead.
    r = leased.client.outcome(leased.op_id, 7, "CONFIRMED", provider_request_id=f"Bearer {canary}")
    refused(r, 422, "FORBIDDEN_FIELD", "provider_request_id")
    assert database_fingerprint() == before
    assert leased.client.get(f"/runs/{leased.run_id}").body["stale_rejections"] == 0
    assert_nowhere(canary, r, logs)


# (c) retry payload


def test_a_retry_event_with_its_payload_is_refused(leased, logs):
    canary = "CANARY_RETRY_789c"
    before = database_fingerprint()
    r = leased.event("x.retry", {"operation_id": leased.op_id, "attempt": 2, "payload": {"body": canary}})
    refused(r, 422, "FORBIDDEN_FIELD", "fields.payload")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


@pytest.mark.parametrize(
    "overrides, path",
    [
        ({"resource": "https://hooks.example.com/retry?api_key={canary}"}, "resource"),
        ({"provider": "openai sk-proj-{canary}x1y2z3"}, "provider"),  # stored, not in the event
        ({"tool": "Bearer {canary}"}, "tool"),
    ],
)
def test_a_retried_intent_with_a_credential_in_a_parameter_writes_nothing(leased, logs, overrides, path):
    canary = "CANARY_RETRY_9b2e"
    before = database_fingerprint()
    body = {name: value.format(canary=canary) for name, value in overrides.items()}
    r = leased.client.intend(leased.run_id, 1, "send-report-1:retry-2", **body)
    refused(r, 422, "FORBIDDEN_FIELD", path)
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_a_replayed_intent_with_a_retry_payload_field_is_refused(leased, logs):
    canary = "CANARY_RETRY_0e44"
    before = database_fingerprint()
    r = leased.client.intend(leased.run_id, 1, "send-report-1", retry_payload={"body": canary})
    refused(r, 422, "VALIDATION_ERROR")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


# (d) child-tool output


def test_child_tool_output_with_an_authorization_header_is_refused(leased, logs):
    canary = "CANARY_CHILD_222d"
    before = database_fingerprint()
    fields = {
        "child_tool": "http.get",
        "result": {"status_code": 200, "headers": {"Content-Type": "text/html", "Authorization": f"Bearer {canary}"}},
    }
    r = leased.event("x.child.result", fields)
    refused(r, 422, "FORBIDDEN_FIELD", "fields.result.headers.Authorization")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_a_credential_inside_child_tool_text_is_refused_by_its_list_path(leased, logs):
    canary = "CANARY_CHILD_63f0"
    before = database_fingerprint()
    fields = {"children": [{"name": "ls"}, {"name": "curl", "summary": f"sent Authorization: Bearer {canary} ok"}]}
    r = leased.event("NOTE", fields)
    refused(r, 422, "FORBIDDEN_FIELD", "fields.children.1.summary")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


# (e) crash while handling a request


def test_an_exception_carrying_the_canary_is_a_bare_500(leased, logs, monkeypatch):
    canary = "CANARY_CRASH_333e"

    def crash(**kwargs):
        raise ValueError(f"provider rejected key {canary}")

    monkeypatch.setattr(notes, "event_append", crash)
    before = database_fingerprint()
    r = leased.event("NOTE", {"message": "about to crash"})
    assert r.status == 500 and r.body == {"error": "INTERNAL", "detail": "internal error"}
    assert "unhandled ValueError" in logs.text()  # the log names the type ...
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)  # ... and never the message


def test_a_console_crash_logs_the_traceback_without_its_message(live_server, logs, monkeypatch, viewer):
    import requests

    canary = "CANARY_CRASH_71aa"

    def crash(*args, **kwargs):
        raise ValueError(f"template context had {canary}")

    from django.conf import settings
    from django.test import Client

    browser = Client()  # a signed-in user: the dashboard is behind login_required
    browser.force_login(viewer)
    session = browser.cookies[settings.SESSION_COOKIE_NAME].value
    monkeypatch.setattr(console.views.dashboard, "render", crash)
    before = database_fingerprint()
    raw = requests.get(live_server.url + "/", cookies={settings.SESSION_COOKIE_NAME: session}, timeout=30)
    assert raw.status_code == 500
    printed = logs.printed.getvalue()
    assert "Internal Server Error: /" in printed
    assert "Traceback (most recent call last):" in printed and "in home" in printed
    assert "ValueError: [message withheld]" in printed
    assert database_fingerprint() == before

    class Body:  # assert_nowhere reads response.raw.content
        pass

    body = Body()
    body.raw = raw
    assert_nowhere(canary, body, logs)


# (f) browser snapshot


def test_a_browser_snapshot_with_cookies_is_refused(leased, logs):
    canary = "CANARY_COOKIE_111f"
    before = database_fingerprint()
    fields = {"url": "https://shop.example.com/cart", "title": "Cart", "cookies": [{"name": "sid", "value": canary}]}
    r = leased.event("x.browser.snapshot", fields)
    refused(r, 422, "FORBIDDEN_FIELD", "fields.cookies")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_a_browser_snapshot_with_local_storage_is_refused(leased, logs):
    canary = "CANARY_COOKIE_4b9a"
    before = database_fingerprint()
    fields = {"url": "https://shop.example.com/cart", "localStorage": {"cart": canary}}
    r = leased.event("x.browser.snapshot", fields)
    refused(r, 422, "FORBIDDEN_FIELD", "fields.localStorage")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


# identifiers that become part of the chain


def test_a_credential_as_lease_owner_is_refused_and_not_counted(leased, logs):
    canary = "CANARY_OWNER_8c3d"
    before = database_fingerprint()
    # A renew by another owner would be a counted stale write whose actor names that owner.
    r = leased.client.post(
        f"/runs/{leased.run_id}/lease/renew", {"owner_id": f"Bearer {canary}", "fencing_token": 1, "ttl_s": 30}
    )
    refused(r, 422, "FORBIDDEN_FIELD", "owner_id")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_a_credential_as_a_runs_external_id_creates_no_run(api_for, acme, logs):
    canary = "CANARY_RUN_2f6b"
    before = database_fingerprint()
    r = api_for(acme).post("/runs", {"schema_version": 1, "external_id": f"ghp_{'Ab3' * 12} {canary}"})
    refused(r, 422, "FORBIDDEN_FIELD", "external_id")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


def test_a_credential_like_key_is_refused_by_the_body_parser_and_not_echoed(leased, logs):
    canary = "CANARY_KEY_d00d"
    # Every key of every body passes the boundary before the schema sees it (ledger/api/body.py).
    r = leased.client.intend(leased.run_id, 1, "send-report-3", **{f"Bearer {canary}": 1})
    refused(r, 422, "FORBIDDEN_FIELD", "*")
    assert_nowhere(canary, r, logs)


# (g) credentials in disguise: the boundary normalises before it judges (issue 11, item 4)

# The canary is the secret itself; each row hides it the way a worker's text could carry it.
ENCODED = [
    ("percent-encoded assignment", lambda c: {"memo": f"password%3D{c}"}),
    ("percent-encoded twice", lambda c: {"memo": f"password%253D{c}"}),
    ("zero-width in the key word", lambda c: {"memo": f"pass\u200bword={c}"}),
    ("zero-width in a key", lambda c: {"pass\u200bword": c}),
    ("fullwidth letters", lambda c: {"memo": f"\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44={c}"}),
    ("homoglyph key (Cyrillic)", lambda c: {"\u0440\u0430ssword": c}),
    ("token=", lambda c: {"memo": f"token={c}"}),
    ("api_token=", lambda c: {"memo": f"call with api_token={c}"}),
    ("pass=", lambda c: {"memo": f"pass={c}"}),
    ("lower-case PEM header", lambda c: {"memo": f"-----begin rsa private key-----\n{c}"}),
    ("control character inside", lambda c: {"memo": f"pass\x07word: {c}"}),
]


@pytest.mark.parametrize("name, fields", ENCODED, ids=[row[0] for row in ENCODED])
def test_a_disguised_credential_is_refused(leased, logs, name, fields):
    canary = "CANARYenc5e11"
    before = database_fingerprint()
    r = leased.event("NOTE", fields(canary))
    refused(r, 422, "FORBIDDEN_FIELD")
    assert database_fingerprint() == before
    assert_nowhere(canary, r, logs)


BARE = [
    ("bare AWS secret access key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYCANARYKEY1"),
    ("AWS access key id", "AKIACANARY7EXAMPLE12"),
    ("Twilio API key (a detect-secrets format)", "SK" + "c0ffee" * 5 + "ab"),
    ("SendGrid key (a detect-secrets format)", "SG." + "C" * 22 + "." + "a1" * 21 + "b"),
    ("Slack webhook (a detect-secrets format)", "https://hooks.slack.com/services/T0CANARY/B0CANARY/xyzCANARY"),
]


@pytest.mark.parametrize("name, secret", BARE, ids=[row[0] for row in BARE])
def test_a_bare_credential_without_a_key_name_is_refused(leased, logs, name, secret):
    before = database_fingerprint()
    r = leased.event("NOTE", {"memo": f"use {secret} for the upload"})
    refused(r, 422, "FORBIDDEN_FIELD", "fields.memo")
    assert database_fingerprint() == before
    assert_nowhere(secret, r, logs)


def test_an_unknown_key_is_never_echoed_in_a_422(leased, logs):
    canary = "hunter2canary"
    r = leased.client.post(f"/runs/{leased.run_id}/lease", {"owner_id": "worker-b", "ttl_s": 10, canary: 1})
    assert (r.status, r.body["fields"][0]["field"]) == (422, "*"), r
    assert_nowhere(canary, r, logs)


def test_ordinary_text_still_passes(leased, logs):
    fields = {
        "memo": "100% done; the pass rate was fine, bypass=none",
        "digest": "sha256:" + "ab" * 32,
        "id": "3f2b8c1e-9d4a-4e5f-8a6b-7c8d9e0f1a2b",
        "name": "Zo\u00eb \u2014 caf\u00e9",
        "url": "https://example.com/a%20b?page=2",
    }
    r = leased.event("NOTE", fields)
    assert r.status == 201, r


# (h) credentials in URLs never reach the log (issue 11, item 3)

URLS = [
    ("API path", "/api/v1/runs/ghp_CANARYurl1aaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ("API path, percent-encoded", "/api/v1/runs/password%3DCANARYurl2"),
    ("API query", "/api/v1/runs/{run_id}?token=CANARYurl3"),
    ("API query, percent-encoded twice", "/api/v1/runs/{run_id}?q=api_token%253DCANARYurl4"),
    ("console page that does not exist", "/no-such-page/AKIACANARYURL5EXAMPL"),
    ("console query", "/runs/?q=xoxb-CANARYurl6-123456789012"),
    ("worker token in a path", "/api/v1/operations/flw_CANARYurl7aaaaaaaaaaaaaaaaaaaa"),
]


@pytest.mark.parametrize("name, url", URLS, ids=[row[0] for row in URLS])
def test_a_credential_in_a_url_is_refused_before_any_log_line(live_server, leased, logs, name, url):
    import re

    import requests

    canary = re.search(r"CANARY\w{4}", url, re.IGNORECASE).group(0)
    before = database_fingerprint()
    raw = requests.get(live_server.url + url.format(run_id=leased.run_id), timeout=30, allow_redirects=False)
    assert raw.status_code == 422, (raw.status_code, raw.text[:200])
    if url.startswith("/api/"):
        assert raw.json()["error"] == "FORBIDDEN_FIELD"
        assert raw.json()["path"] in ("url.path", "url.query")
    assert canary.lower() not in raw.text.lower()
    assert database_fingerprint() == before
    assert tables_containing(canary) == []
    assert canary.lower() not in logs.text().lower(), "canary in a log line"
    assert any(record.name == "fenceline.boundary" for record in logs.caplog.records)


def test_a_log_line_from_other_code_that_carries_a_credential_is_withheld(logs):
    canary = "CANARYlog8"
    logging.getLogger("django.server").info('"GET /hook?password=%s HTTP/1.1" 200 12', canary)
    logging.getLogger("some.library").warning("retrying with Authorization: Bearer %s", canary)
    printed = logs.printed.getvalue()
    assert printed.count("[log line withheld: it carried a credential-like value]") == 2, printed
    assert canary not in printed


# --- the search itself works ------------------------------------------------------------------


def test_the_leak_search_finds_what_is_stored_and_the_logs_hold_no_body_or_sql(leased, logs):
    marker = "MARKER_STORED_e5c1"
    fields = {
        "credential_ref": "github-write-lease-7",
        "credential_version": 18,
        "error_code": "E_TIMEOUT",
        "args_digest": "sha256:" + "0" * 64,
        "summary": f"retrying {marker}",
    }
    r = leased.event("NOTE", fields)
    assert r.status == 201, r
    assert ("ledger_event", "fields") in text_columns()
    assert tables_containing(marker) == ["ledger_event"]
    # The marker travelled in a request body and as an SQL parameter; neither was logged.
    assert logs.caplog.records, "the log capture sees the request"
    assert marker not in logs.text()
