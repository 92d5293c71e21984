"""A worker process for the lifespan kill test: takes the lease, opens two browser sessions
(registered with Fenceline), saves a progress checkpoint, says so on stdout, then works on
(sleeps) until it is killed — without ever closing its sessions."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository root

from tests.faults.worker_http import poster


def main(run_id: str) -> None:
    post = poster()

    token = post(f"/runs/{run_id}/lease", {"owner_id": f"worker-pid-{os.getpid()}", "ttl_s": 2})["fencing_token"]
    for n in (1, 2):
        post(
            f"/runs/{run_id}/resources",
            {
                "fencing_token": token,
                "kind": "browser_session",
                "provider": "sandbox",
                "handle": f"portal-{run_id}-{n}",
            },
        )
    post(f"/runs/{run_id}/checkpoints", {"fencing_token": token, "position": "supplier-7", "state": {"done": 6}})
    print("READY", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
