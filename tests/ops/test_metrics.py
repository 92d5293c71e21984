"""/metrics: every metric exists after the demo seed with a value derived here independently
(from the database's own rows, read without Fenceline's code), and the process counters are
summed across processes (prometheus_client's multiprocess mode, as under gunicorn)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import make_worker, new_run
from tests.helpers import embedded_database, metric_value, parse_metrics, spawned

ROOT = Path(__file__).resolve().parents[2]

# Every family /metrics must expose (docs/operations.md explains each).
NAMES = {
    "fenceline_stale_token_rejections",
    "unknown_outcomes",
    "fenceline_unknown_outcome_oldest_age_seconds",
    "unknown_outcome_duration_seconds",
    "reconciliations",
    "duplicate_rejections",
    "approval_interruptions",
    "fenceline_approvals_pending",
    "retry_by_effect_class",
    "audit_events_accepted",
    "audit_verification_failures",
    "audit_unknown_outcomes",
    "fenceline_verification_lag_events",
    "fenceline_seconds_since_verified_checkpoint",
    "fenceline_active_runs",
    "fenceline_stuck_runs",
    "fenceline_run_totals_age_seconds",
    "fenceline_lease_acquisitions",
    "fenceline_lease_renewals",
    "fenceline_lease_takeovers",
    "fenceline_lease_expiries",
    "fenceline_breaker_state",
    "fenceline_flow_throttled",
    "fenceline_flow_in_flight",
    "fenceline_cost_limit_cents",
    "fenceline_cost_reserved_cents",
    "fenceline_cost_settled_cents",
    "fenceline_credential_leases_active",
    "fenceline_credential_lease_oldest_age_seconds",
    "fenceline_live_instances",
    "fenceline_active_operations",
    "fenceline_resources_open",
    "fenceline_orphaned_resources",
    "fenceline_cleanup_oldest_pending_seconds",
    "fenceline_cleanup_alerts_open",
    "fenceline_drains",
    "fenceline_worker_restarts",
    "fenceline_restart_episodes",
    "fenceline_workers",
    "fenceline_job_seconds_since_finished",
    "fenceline_job_runs",
    "fenceline_job_failures",
    "fenceline_job_last_duration_seconds",
    "fenceline_job_items",
    "fenceline_http_request_duration_seconds",
    "fenceline_throttled_requests",
}


def manage(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_every_metric_exists_after_the_demo_seed_with_the_value_its_rows_give(state_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env |= {"FENCELINE_STATE_DIR": str(state_dir), "FENCELINE_LOG_FORMAT": "plain"}
    manage(env, "demo", "--no-serve")
    families = parse_metrics(manage(env, "metrics"))
    assert set(families) >= NAMES, sorted(NAMES - set(families))

    with embedded_database(state_dir) as db:

        def one(sql: str, *params) -> float:
            return float(db.execute(sql, params or None).fetchone()[0] or 0)

        tenants = [slug for (slug,) in db.execute("SELECT slug FROM ledger_tenant")]
        assert "demo" in tenants
        for slug in tenants:
            of_tenant = (
                "JOIN ledger_run r ON e.run_id = r.id JOIN ledger_tenant t ON r.tenant_id = t.id WHERE t.slug = %s"
            )
            # Accepted: up to the run's head (the demo's forged event past the head was never accepted).
            events = one(f"SELECT COUNT(*) FROM ledger_event e {of_tenant} AND e.seq <= r.last_seq", slug)  # noqa: S608
            assert metric_value(families, "audit_events_accepted", "_total", tenant=slug) == events, slug
            stale = one(f"SELECT COUNT(*) FROM ledger_event e {of_tenant} AND e.type = 'STALE_TOKEN_REJECTED'", slug)  # noqa: S608
            assert metric_value(families, "fenceline_stale_token_rejections", "_total", tenant=slug) == stale, slug
            unknown = one(
                "SELECT COUNT(*) FROM ledger_operation o JOIN ledger_tenant t ON o.tenant_id = t.id"
                " WHERE t.slug = %s AND o.phase = 'UNKNOWN'",
                slug,
            )
            assert metric_value(families, "audit_unknown_outcomes", tenant=slug) == unknown, slug
            in_flight = one(
                "SELECT COUNT(*) FROM ledger_operation o JOIN ledger_tenant t ON o.tenant_id = t.id"
                " WHERE t.slug = %s AND o.phase IN ('AUTHORIZED', 'DISPATCHED')",
                slug,
            )
            assert metric_value(families, "fenceline_active_operations", tenant=slug) == in_flight, slug
        demo_events = metric_value(families, "audit_events_accepted", "_total", tenant="demo")
        assert demo_events > 50
        assert metric_value(families, "fenceline_stale_token_rejections", "_total", tenant="demo") >= 1

        cases = "FROM approvals_reconciliationcase c JOIN ledger_tenant t ON c.tenant_id = t.id WHERE t.slug = 'demo'"
        for status in ("LOOKUP", "OPEN", "CLAIMED", "ESCALATED"):
            expected = one(f"SELECT COUNT(*) {cases} AND c.status = %s", status)
            assert metric_value(families, "unknown_outcomes", tenant="demo", status=status) == expected, status
        by_reconciler = one(f"SELECT COUNT(*) {cases} AND c.status = 'RESOLVED' AND c.resolved_by LIKE 'reconciler:%'")
        by_people = one(f"SELECT COUNT(*) {cases} AND c.status = 'RESOLVED' AND c.resolved_by NOT LIKE 'reconciler:%'")
        assert by_reconciler == 1  # the demo's lost answer, found at the sandbox provider
        assert metric_value(families, "reconciliations", "_total", tenant="demo", source="reconciler") == by_reconciler
        assert metric_value(families, "reconciliations", "_total", tenant="demo", source="person") == by_people
        settled = by_reconciler + by_people
        assert metric_value(families, "unknown_outcome_duration_seconds", "_count", tenant="demo") == settled
        assert (
            metric_value(families, "unknown_outcome_duration_seconds", "_bucket", tenant="demo", le="+Inf") == settled
        )

        approvals = "FROM approvals_approvalrequest a JOIN ledger_tenant t ON a.tenant_id = t.id WHERE t.slug = 'demo'"
        for (kind,) in db.execute(f"SELECT DISTINCT kind {approvals}"):
            expected = one(f"SELECT COUNT(*) {approvals} AND a.kind = %s", kind)
            assert metric_value(families, "approval_interruptions", "_total", tenant="demo", kind=kind) == expected

        for slug, state in db.execute("SELECT slug, breaker_state FROM ledger_tenant"):
            assert metric_value(families, "fenceline_breaker_state", tenant=slug, state=state) == 1.0
            assert sum(v for k, v in families["fenceline_breaker_state"].items() if ("tenant", slug) in k) == 1.0
        assert "DEGRADED" in {state for (state,) in db.execute("SELECT breaker_state FROM ledger_tenant")}

        for slug, status, n in db.execute(
            "SELECT t.slug, w.status, COUNT(*) FROM ledger_worker w JOIN ledger_tenant t ON w.tenant_id = t.id"
            " GROUP BY t.slug, w.status"
        ):
            assert metric_value(families, "fenceline_workers", tenant=slug, status=status) == n
        assert metric_value(families, "fenceline_workers", tenant="demo", status="QUARANTINED") >= 1

        open_alerts = one("SELECT COUNT(*) FROM ledger_resourcealert WHERE cleared_at IS NULL")
        assert open_alerts >= 1
        assert sum(families["fenceline_cleanup_alerts_open"].values()) == open_alerts
        takeovers = one("SELECT COUNT(*) FROM ledger_leasegrant WHERE previous_owner_id IS NOT NULL")
        assert (
            sum(families["fenceline_lease_takeovers"].get(k, 0) for k in families["fenceline_lease_takeovers"])
            == takeovers
        )


# --- two processes, one scrape ------------------------------------------------------------

RENEWALS = 3
STALE = 2


def _worker_calls(token: str, run_id: str, owner: str, key: str) -> None:
    """In a child process: lease, renewals, a replay and a mismatch of one key, a retry, and
    stale writes, through the worker API (Django's test client: the real middleware)."""
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="127.0.0.1")

    def post(path: str, body: dict) -> dict:
        answer = client.post(f"/api/v1{path}", body, content_type="application/json")
        return {"status": answer.status_code, **answer.json()}

    lease = post(f"/runs/{run_id}/lease", {"owner_id": owner, "ttl_s": 60})
    assert lease["status"] == 200, lease
    t = lease["fencing_token"]
    for _ in range(RENEWALS):
        assert (
            post(f"/runs/{run_id}/lease/renew", {"owner_id": owner, "fencing_token": t, "ttl_s": 60})["status"] == 200
        )
    intent = {
        "fencing_token": t,
        "tool": "search",
        "action": "query",
        "resource": "index:docs",
        "effect_class": "IDEMPOTENT",
        "idempotency_key": key,
    }
    first = post(f"/runs/{run_id}/operations", intent)
    assert first["status"] == 201, first
    assert post(f"/runs/{run_id}/operations", intent)["status"] == 200  # a replay
    assert post(f"/runs/{run_id}/operations", {**intent, "resource": "index:other"})["status"] == 422  # a mismatch
    op = first["operation_id"]
    assert post(f"/operations/{op}/authorize", {"fencing_token": t})["status"] == 200
    assert post(f"/operations/{op}/dispatch", {"fencing_token": t})["status"] == 200
    assert post(f"/operations/{op}/outcome", {"fencing_token": t, "outcome": "FAILED"})["status"] == 200
    retried = post(f"/operations/{op}/retry", {"fencing_token": t})
    assert retried["status"] == 200, retried
    for _ in range(STALE):
        assert post(f"/runs/{run_id}/operations", {**intent, "fencing_token": t + 7})["status"] == 409


@pytest.mark.django_db(transaction=True)
def test_process_counters_are_summed_across_two_processes(tmp_path, monkeypatch):
    identity = make_worker("metrics-two", "worker-1")
    runs = [str(new_run(identity.worker).pk) for _ in range(2)]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # the children write here
    children = [
        spawned("tests.ops.test_metrics", "_worker_calls", identity.token, run_id, f"owner-{i}", f"key-{i}")
        for i, run_id in enumerate(runs)
    ]
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    assert len(list(tmp_path.glob("*.db"))) >= 2  # one file per process at least

    from ledger.observability.metrics import scrape

    families = parse_metrics(scrape().decode())
    tenant = "metrics-two"
    assert metric_value(families, "fenceline_lease_acquisitions", "_total", tenant=tenant, kind="new") == 2
    assert metric_value(families, "fenceline_lease_renewals", "_total", tenant=tenant) == 2 * RENEWALS
    assert metric_value(families, "duplicate_rejections", "_total", tenant=tenant, kind="replay") == 2
    assert metric_value(families, "duplicate_rejections", "_total", tenant=tenant, kind="mismatch") == 2
    assert metric_value(families, "retry_by_effect_class", "_total", tenant=tenant, effect_class="IDEMPOTENT") == 2
    # Stale writes are counted in the database, on the run, in the refusal's transaction.
    assert metric_value(families, "fenceline_stale_token_rejections", "_total", tenant=tenant) == 2 * STALE
    renew_route = "api/v1/runs/<run_id>/lease/renew"
    assert (
        metric_value(
            families, "fenceline_http_request_duration_seconds", "_count", route=renew_route, method="POST", code="200"
        )
        == 2 * RENEWALS
    )
    # No label carries a run or operation id.
    text = scrape().decode()
    assert not any(run_id in text for run_id in runs)


def test_docs_list_every_metric_and_their_alert_rules_use_only_metrics_that_exist():
    import re

    import yaml

    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Health, readiness and metrics", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for row in re.findall(r"^\| `([a-z_]+)`(.*?)\|", section, flags=re.M):
        first, rest = row
        documented.add(first)
        documented.update(f"fenceline_cost_{v}" for v in re.findall(r"`_(reserved_cents|settled_cents)`", rest))
        documented.update(re.findall(r"`(fenceline_[a-z_]+)`", rest))
    documented = {name.removesuffix("_total") for name in documented}
    assert documented >= NAMES, sorted(NAMES - documented)
    rules = yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])["groups"][0]["rules"]
    assert len(rules) >= 15
    known = NAMES | {f"{n}_total" for n in NAMES} | {f"{n}_bucket" for n in NAMES}
    for rule in rules:
        used = set(
            re.findall(
                r"\b((?:fenceline_|audit_|unknown_|reconciliations|duplicate_|retry_|approval_)[a-z_]*)", rule["expr"]
            )
        )
        assert used and used <= known, (rule["alert"], used - known)
