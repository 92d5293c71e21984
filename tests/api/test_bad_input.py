"""Bad input over HTTP gets the documented code, never a 500, and writes nothing."""

import uuid

import pytest

from ledger.models import Event, LeaseGrant, Operation, Run, RunLease

OP = {
    "tool": "email",
    "action": "send",
    "resource": "mailto:a@example.com",
    "effect_class": "IDEMPOTENT",
    "idempotency_key": "k-1",
}


def snapshot():
    return (
        Run.objects.count(),
        Event.objects.count(),
        Operation.objects.count(),
        LeaseGrant.objects.count(),
        list(RunLease.objects.order_by("run_id").values_list("fencing_token", "owner_id", "expires_at")),
        list(Run.objects.order_by("pk").values_list("stale_rejections", flat=True)),
    )


@pytest.fixture
def leased(api_for, acme):
    """A run of acme with a lease (token 1) and one authorized operation."""
    client = api_for(acme)
    run_id = client.leased_run()
    op_id = client.intend(run_id, 1, "existing").body["operation_id"]
    client.authorize(op_id, 1)
    return client, run_id, op_id


def post_paths(run_id: str, op_id: str) -> list[str]:
    return [
        "/runs",
        f"/runs/{run_id}/lease",
        f"/runs/{run_id}/lease/renew",
        f"/runs/{run_id}/lease/release",
        f"/runs/{run_id}/operations",
        f"/runs/{run_id}/effects",
        f"/runs/{run_id}/events",
        f"/operations/{op_id}/authorize",
        f"/operations/{op_id}/dispatch",
        f"/operations/{op_id}/outcome",
        "/fence/check",
    ]


def test_unknown_schema_version_is_refused_and_writes_nothing(api_for, acme):
    client = api_for(acme)
    before = snapshot()
    for version in (0, 2, 99):
        r = client.post("/runs", {"schema_version": version})
        assert (r.status, r.body["error"]) == (422, "UNKNOWN_SCHEMA_VERSION"), r
        assert str(version) in r.body["detail"]
    assert snapshot() == before


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"', b'{"schema_version": NaN}', b"\xff\xfe"])
def test_malformed_json_is_refused_on_every_post(leased, raw):
    client, run_id, op_id = leased
    before = snapshot()
    for path in post_paths(run_id, op_id):
        r = client.post(path, raw=raw)
        assert (r.status, r.body["error"]) == (400, "MALFORMED_JSON"), (path, r)
    assert snapshot() == before


@pytest.mark.parametrize(
    "path_kind, body, field",
    [
        ("lease", {"ttl_s": 10}, "owner_id"),
        ("lease", {"owner_id": "a", "ttl_s": "10"}, "ttl_s"),
        ("lease", {"owner_id": "a", "ttl_s": 0}, "ttl_s"),
        ("lease", {"owner_id": "a", "ttl_s": 3601}, "ttl_s"),
        ("lease", {"owner_id": "a", "ttl_s": 1.5}, "ttl_s"),  # 30.0 is an integer (JSON Schema's and ours)
        ("lease", {"owner_id": "a", "ttl_s": True}, "ttl_s"),
        ("lease", {"owner_id": 7, "ttl_s": 10}, "owner_id"),
        ("lease", {"owner_id": "a", "ttl_s": 10, "extra": 1}, "extra"),  # an unknown key is named
        ("renew", {"owner_id": "worker-a", "fencing_token": "1", "ttl_s": 10}, "fencing_token"),
        ("operations", {**OP, "fencing_token": 1, "effect_class": "SAFE"}, "effect_class"),
        ("operations", {**OP, "fencing_token": 1, "tool": ""}, "tool"),
        ("operations", {**OP, "fencing_token": 1, "estimated_cost_cents": -5}, "estimated_cost_cents"),
        (
            "operations",
            {k: v for k, v in OP.items() if k != "idempotency_key"} | {"fencing_token": 1},
            "idempotency_key",
        ),
        ("effects", {**OP, "fencing_token": 1, "effect_class": "SAFE"}, "effect_class"),
        ("effects", {**OP, "fencing_token": 1, "credential_lease_id": ""}, "credential_lease_id"),
        ("effects", {**OP, "fencing_token": 1, "credential_lease_id": 7}, "credential_lease_id"),
        ("outcome", {"fencing_token": 1, "outcome": "PROBABLY_FINE"}, "outcome"),
        ("events", {"fencing_token": 1, "type": "NOTE", "fields": [1, 2]}, "fields"),
        ("fence", {"run_id": "x"}, "fencing_token"),
    ],
)
def test_missing_or_wrongly_typed_fields_are_named_in_a_422(leased, path_kind, body, field):
    client, run_id, op_id = leased
    path = {
        "lease": f"/runs/{run_id}/lease",
        "renew": f"/runs/{run_id}/lease/renew",
        "operations": f"/runs/{run_id}/operations",
        "effects": f"/runs/{run_id}/effects",
        "outcome": f"/operations/{op_id}/outcome",
        "events": f"/runs/{run_id}/events",
        "fence": "/fence/check",
    }[path_kind]
    before = snapshot()
    r = client.post(path, body)
    assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), r
    assert field in [problem["field"] for problem in r.body["fields"]], r
    assert snapshot() == before


def test_an_unknown_key_is_named_in_the_field_and_the_problem(leased):
    client, run_id, _ = leased
    before = snapshot()
    r = client.post(f"/runs/{run_id}/lease", {"owner_id": "a", "ttl_s": 10, "ttl_seconds": 10})
    assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), r
    assert r.body["fields"] == [
        {"field": "ttl_seconds", "problem": "'ttl_seconds' is not a field this call takes (see docs/api.md)"}
    ]
    assert r.body["detail"] == "ttl_seconds: 'ttl_seconds' is not a field this call takes (see docs/api.md)"
    # A key that is not a plain name is still never echoed.
    odd = "ttl seconds, please"
    r = client.post(f"/runs/{run_id}/lease", {"owner_id": "a", "ttl_s": 10, odd: 1})
    assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), r
    assert odd not in str(r.body)
    assert r.body["fields"] == [
        {"field": "*", "problem": "a key this call does not take (not shown: it does not read as a field name)"}
    ]
    assert snapshot() == before


def test_event_types_reserved_for_fenceline_cannot_be_appended(leased):
    client, run_id, _ = leased
    before = snapshot()
    for event_type in ("LEASE_ACQUIRED", "OPERATION_CONFIRMED", "STALE_TOKEN_REJECTED", "x.", "x.UPPER", "note"):
        r = client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": event_type, "fields": {}})
        assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR"), (event_type, r)
    too_big = {"blob": "a" * (16 * 1024)}
    r = client.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": too_big})
    assert (r.status, r.body["error"]) == (422, "VALIDATION_ERROR")
    assert snapshot() == before


def test_unknown_runs_and_operations_are_404(leased):
    client, _run_id, _op_id = leased
    before = snapshot()
    missing_run, missing_op = str(uuid.uuid4()), str(uuid.uuid4())
    for r in (
        client.get(f"/runs/{missing_run}"),
        client.get("/runs/not-a-uuid"),
        client.get(f"/runs/{missing_run}/events"),
        client.acquire(missing_run, "a"),
        client.intend(missing_run, 1, "k"),
        client.post(f"/runs/{missing_run}/effects", {**OP, "fencing_token": 1}),
        client.get(f"/operations/{missing_op}"),
        client.get(f"/operations/{missing_op}/retry-decision"),
        client.dispatch(missing_op, 1),
        client.dispatch("not-a-uuid", 1),
    ):
        assert (r.status, r.body["error"]) == (404, "NOT_FOUND"), r
    assert client.post("/fence/check", {"run_id": missing_run, "fencing_token": 1}).body == {"valid": False}
    assert snapshot() == before


def test_another_tenants_run_and_operation_are_404_not_403(leased, api_for, outsider):
    _, run_id, op_id = leased
    intruder = api_for(outsider)
    before = snapshot()
    responses = [
        intruder.get(f"/runs/{run_id}"),
        intruder.get(f"/runs/{run_id}/events"),
        intruder.acquire(run_id, "intruder"),
        intruder.post(f"/runs/{run_id}/lease/renew", {"owner_id": "worker-a", "fencing_token": 1, "ttl_s": 5}),
        intruder.post(f"/runs/{run_id}/lease/release", {"owner_id": "worker-a", "fencing_token": 1}),
        intruder.intend(run_id, 1, "steal"),
        intruder.post(f"/runs/{run_id}/effects", {**OP, "fencing_token": 1}),
        intruder.post(f"/runs/{run_id}/events", {"fencing_token": 1, "type": "NOTE", "fields": {}}),
        intruder.get(f"/operations/{op_id}"),
        intruder.get(f"/operations/{op_id}/retry-decision"),
        intruder.authorize(op_id, 1),
        intruder.dispatch(op_id, 1),
        intruder.outcome(op_id, 1, "CONFIRMED"),
    ]
    for r in responses:
        assert (r.status, r.body["error"]) == (404, "NOT_FOUND"), r
    assert intruder.post("/fence/check", {"run_id": run_id, "fencing_token": 1}).body == {"valid": False}
    assert snapshot() == before


@pytest.mark.parametrize("token", [None, "", "flw_wrong", "x" * 500])
def test_missing_or_wrong_bearer_token_is_401(leased, api_for, token):
    _, run_id, op_id = leased
    client = api_for(token=token)
    before = snapshot()
    for r in (
        client.post("/runs", {"schema_version": 1}),
        client.get(f"/runs/{run_id}"),
        client.acquire(run_id, "a"),
        client.dispatch(op_id, 1),
        client.post("/fence/check", {"run_id": run_id, "fencing_token": 1}),
    ):
        assert (r.status, r.body["error"]) == (401, "UNAUTHORIZED"), r
    assert snapshot() == before


def test_validation_errors_do_not_echo_the_value_sent(leased):
    client, run_id, _ = leased
    canary = "CANARY-7f3a-do-not-echo"
    r = client.post(f"/runs/{run_id}/lease", {"owner_id": "a", "ttl_s": canary})
    assert r.status == 422
    assert canary not in r.raw.text
