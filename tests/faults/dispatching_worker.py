"""A worker process for the kill test: takes the lease, dispatches one operation, says so
on stdout, then "calls the provider" (sleeps) until it is killed."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository root

from tests.faults.worker_http import poster


def main(run_id: str) -> None:
    post = poster()

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
