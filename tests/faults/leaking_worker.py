"""A worker process for the lifespan kill test: takes the lease, opens two browser sessions
(registered with Fenceline), saves a progress checkpoint, says so on stdout, then works on
(sleeps) until it is killed — without ever closing its sessions."""

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
