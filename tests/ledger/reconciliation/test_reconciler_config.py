"""Reconcilers by configuration (ledger/services/reconciliation/registry.py, credentials.py,
checks.py): a team's reconciler by dotted path, credentials by reference sent as the header
they name and resolved at each call, and the start-up check that names a bad reconciler or an
unresolvable reference — never a secret's value."""

import base64

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from approvals.services.lookups import cases_look_up
from ledger.models import Tenant
from ledger.services.reconciliation.checks import reconcilers_check
from tests.fakes.base import FakeProvider, Reply
from tests.ledger.reconciliation.conftest import (
    CANARY,
    CANARY_ENV,
    assert_nowhere,
    configure,
    looked_up,
    unknown_effect,
)

pytestmark = pytest.mark.django_db

TEAM = "tests.ledger.reconciliation.team_reconciler:build"


class FakeRecords(FakeProvider):
    """A provider with records by key: GET /v1/records?key=K -> 200 {"id", "status"} or 404."""

    def __init__(self, *, credential: str, header: str = "Authorization") -> None:
        self.auth_header = header
        super().__init__(credential=credential)
        self.records: dict[str, dict] = {}

    def route(self, path, query):
        record = self.records.get(query.get("key", [""])[0])
        return Reply(200, record) if record else Reply(404, {"error_code": "not_found"})


def http_config(url: str, auth: dict) -> dict:
    return {
        "kind": "http",
        "provider": "records",
        "base_url": url,
        "by_idempotency_key": "/v1/records?key={idempotency_key}",
        "status_field": "status",
        "happened": ["done"],
        "auth": auth,
    }


def checked(settings, config: dict) -> list[str]:
    configure(settings, "team", config)
    return [message.msg for message in reconcilers_check()]


def test_a_teams_reconciler_by_dotted_path_settles_an_unknown(acme, settings, canary):
    auth = {"type": "bearer", "secret": f"env:{CANARY_ENV}"}
    configure(
        settings,
        "team",
        {"kind": "python", "path": TEAM, "provider": "team", "records": {"t-1": "T-900"}, "auth": auth},
    )
    assert reconcilers_check() == []
    _run, op, _ = unknown_effect(acme.worker, "t-1", provider="team", tool="ledger", resource="book:1")

    assert op.reconciler == "team"
    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert (op.reconciliation, op.provider_request_id) == ("HAPPENED", "T-900")


@pytest.mark.parametrize(
    "path, message",
    [
        (
            "no.such.module:build",
            "reconciler 'team': path 'no.such.module:build' cannot be imported (ModuleNotFoundError)",
        ),
        (
            "tests.ledger.reconciliation.team_reconciler:nope",
            "reconciler 'team': module 'tests.ledger.reconciliation.team_reconciler' has no 'nope'",
        ),
        (
            "tests.ledger.reconciliation.team_reconciler:NOT_A_FACTORY",
            "reconciler 'team': 'tests.ledger.reconciliation.team_reconciler:NOT_A_FACTORY' is not callable",
        ),
        (
            "tests.ledger.reconciliation.team_reconciler.build",
            "reconciler 'team': path must be \"package.module:factory\", got 'tests.ledger.reconciliation.team_reconciler.build'",
        ),
    ],
)
def test_a_bad_dotted_path_is_a_config_error_that_names_it(settings, path, message):
    assert checked(settings, {"kind": "python", "path": path, "records": {}}) == [message]


def test_an_unknown_kind_or_setting_is_a_config_error(settings):
    assert checked(settings, {"kind": "carrier-pigeon"}) == [
        "reconciler 'team': kind must be one of http, stripe, github, slack, email, python"
    ]
    auth = {"type": "bearer", "secret": "env:X"}
    assert checked(settings, {"kind": "stripe", "auth": auth, "colour": "blue"}) == [
        "reconciler 'team': unknown setting(s) colour"
    ]
    assert checked(settings, {"kind": "github"}) == [
        'reconciler \'team\': auth is required ({"type": ..., "secret": "env:NAME"})'
    ]


def test_an_unresolvable_reference_names_the_reconciler_and_the_reference(settings, monkeypatch, tmp_path):
    monkeypatch.delenv("FENCELINE_TEST_MISSING", raising=False)
    auth = {"type": "bearer", "secret": "env:FENCELINE_TEST_MISSING"}
    assert checked(settings, {"kind": "stripe", "auth": auth}) == [
        "reconciler 'team': credential env:FENCELINE_TEST_MISSING is not set or empty"
    ]
    missing = tmp_path / "nope"
    auth = {"type": "header", "name": "X-Api-Key", "secret": f"file:{missing}"}
    assert checked(settings, {"kind": "stripe", "auth": auth}) == [
        f"reconciler 'team': credential file:{missing} cannot be read (FileNotFoundError)"
    ]


def test_a_secret_pasted_where_a_reference_belongs_is_refused_without_echoing_it(settings):
    for auth in ({"type": "bearer", "secret": CANARY}, {"type": "bearer", "secret": f"env:{CANARY}"}):
        [message] = checked(settings, {"kind": "stripe", "auth": auth})
        assert message == 'reconciler \'team\': auth.secret must be a reference "env:NAME" or "file:/absolute/path"'
        assert CANARY not in message


def test_manage_py_check_refuses_a_bad_reconciler(settings):
    configure(settings, "team", {"kind": "python", "path": "no.such.module:build"})
    with pytest.raises(SystemCheckError, match=r"fenceline\.E101"):
        call_command("check")


@pytest.mark.parametrize(
    "auth, header, value",
    [
        ({"type": "bearer"}, "Authorization", f"Bearer {CANARY}"),
        ({"type": "basic"}, "Authorization", "Basic " + base64.b64encode(CANARY.encode()).decode()),
        ({"type": "header", "name": "X-Api-Key"}, "X-Api-Key", CANARY),
    ],
)
def test_each_auth_type_sends_its_header_and_the_secret_is_kept_nowhere(
    acme, settings, canary, caplog, auth, header, value
):
    fake = FakeRecords(credential=value, header=header).start()
    try:
        fake.records["rec-1"] = {"id": "r_1", "status": "done"}
        configure(settings, "records", http_config(fake.url, {**auth, "secret": f"env:{CANARY_ENV}"}))
        run, op, _ = unknown_effect(acme.worker, "rec-1", provider="records", tool="records", resource="r")

        assert cases_look_up().happened == 1  # the fake answers 401 to anything else
        assert fake.seen[0].headers[header] == value
        op.refresh_from_db()
        assert op.provider_request_id == "r_1"
        assert_nowhere(CANARY, caplog.text, str(looked_up(run)))
    finally:
        fake.stop()


def test_a_file_reference_is_read_at_each_call(acme, settings, tmp_path, caplog):
    secret = tmp_path / "records-key"
    secret.write_text("first-key-value\n")
    fake = FakeRecords(credential="Bearer first-key-value").start()
    try:
        fake.records.update({"rec-a": {"id": "r_a", "status": "done"}, "rec-b": {"id": "r_b", "status": "done"}})
        configure(settings, "records", http_config(fake.url, {"type": "bearer", "secret": f"file:{secret}"}))
        unknown_effect(acme.worker, "rec-a", provider="records", tool="records", resource="r")
        assert cases_look_up().happened == 1

        secret.write_text(CANARY)  # rotated: the next lookup sends the new one
        fake.credential = f"Bearer {CANARY}"
        unknown_effect(acme.worker, "rec-b", provider="records", tool="records", resource="r")
        assert cases_look_up().happened == 1
        assert fake.seen[-1].headers["Authorization"] == f"Bearer {CANARY}"
        assert_nowhere(CANARY, caplog.text)
    finally:
        fake.stop()


def test_a_reference_gone_at_call_time_is_looked_up_again_later_naming_only_the_reference(acme, settings, monkeypatch):
    monkeypatch.delenv("FENCELINE_TEST_GONE", raising=False)
    fake = FakeRecords(credential="Bearer x").start()
    try:
        configure(settings, "records", http_config(fake.url, {"type": "bearer", "secret": "env:FENCELINE_TEST_GONE"}))
        run, _op, _ = unknown_effect(acme.worker, "rec-gone", provider="records", tool="records", resource="r")

        assert cases_look_up().later == 1
        [looked] = looked_up(run)
        assert looked["why"] == "reconciler 'records': credential env:FENCELINE_TEST_GONE is not set or empty"
        assert fake.seen == []  # nothing was sent without it
    finally:
        fake.stop()


def test_the_canary_search_finds_a_secret_in_any_row_or_log(acme, caplog):
    """assert_nowhere can fail: the canary (or its base64) written anywhere is found."""
    Tenant.objects.filter(pk=acme.tenant.pk).update(name=base64.b64encode(CANARY.encode()).decode())
    with pytest.raises(AssertionError, match="the secret is in table ledger_tenant"):
        assert_nowhere(CANARY)
    Tenant.objects.filter(pk=acme.tenant.pk).update(name="acme")
    with pytest.raises(AssertionError, match="the secret is in the logs"):
        assert_nowhere(CANARY, f"Authorization: Bearer {CANARY}")
