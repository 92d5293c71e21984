import re

import requests


def test_openapi_schema_lists_every_worker_call(live_server):
    schema = requests.get(f"{live_server.url}/api/v1/openapi.json", timeout=10).json()
    paths = set(schema["paths"])
    assert {
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/lease",
        "/api/v1/runs/{run_id}/lease/renew",
        "/api/v1/runs/{run_id}/lease/release",
        "/api/v1/runs/{run_id}/operations",
        "/api/v1/runs/{run_id}/effects",
        "/api/v1/runs/{run_id}/events",
        "/api/v1/operations/{operation_id}",
        "/api/v1/operations/{operation_id}/authorize",
        "/api/v1/operations/{operation_id}/dispatch",
        "/api/v1/operations/{operation_id}/outcome",
        "/api/v1/operations/{operation_id}/retry-decision",
        "/api/v1/fence/check",
    } <= paths
    assert "starter policy" in schema["info"]["description"]
    assert schema["components"]["securitySchemes"]


def test_browsable_docs_load_their_assets_locally(live_server):
    page = requests.get(f"{live_server.url}/api/v1/docs", timeout=10)
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(a.startswith("/") for a in assets), assets  # no CDN
    for asset in assets:
        assert requests.get(live_server.url + asset, timeout=10).status_code == 200, asset
