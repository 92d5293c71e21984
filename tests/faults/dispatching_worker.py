"""A worker process for the kill test: takes the lease, dispatches one operation, says so
on stdout, then "calls the provider" (sleeps) until it is killed."""

import json
import os
import sys
import time

import requests


def main(run_id: str) -> None:
    base = os.environ["FENCELINE_URL"].rstrip("/") + "/api/v1"
    session = requests.Session()
    session.headers.update(
        {"Authorization": f"Bearer {os.environ['FENCELINE_TOKEN']}", "Content-Type": "application/json"}
    )

    def post(path: str, body: dict) -> dict:
        response = session.post(base + path, data=json.dumps(body), timeout=10)
        response.raise_for_status()
        return response.json()

    token = post(f"/runs/{run_id}/lease", {"owner_id": f"worker-pid-{os.getpid()}", "ttl_s": 30})["fencing_token"]
    op_id = post(
        f"/runs/{run_id}/operations",
        {
            "fencing_token": token,
            "tool": "payments",
            "action": "charge",
            "resource": "customer:881",
            "effect_class": "NON_RETRYABLE",
            "idempotency_key": "charge:customer:881:invoice-17",
        },
    )["operation_id"]
    post(f"/operations/{op_id}/authorize", {"fencing_token": token})
    post(f"/operations/{op_id}/dispatch", {"fencing_token": token})
    print("DISPATCHED", op_id, flush=True)
    time.sleep(3600)  # the provider call that never returns before the kill


if __name__ == "__main__":
    main(sys.argv[1])
