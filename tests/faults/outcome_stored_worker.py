"""A worker process built on the Python client, for the kill point "after the provider's
response is stored": it sends one NON_RETRYABLE email (the provider call appends a line to
PROVIDER_LOG), reports the outcome, prints STORED and stops there, so that a SIGKILL lands
after the outcome has committed and before the worker goes on. Run again on the same run
(a replacement worker after the lease expired), it replays the operation under the same
idempotency key, prints DECIDED <phase>, checkpoints and completes the run."""

import os
import sys
import time
from pathlib import Path

from fenceline_client import Client, Done


def main(run_id: str) -> int:
    client = Client(os.environ["FENCELINE_URL"], os.environ["FENCELINE_TOKEN"])
    provider_log = Path(os.environ["PROVIDER_LOG"])

    def send() -> Done:
        with provider_log.open("a") as log:
            log.write(f"sent {run_id}\n")
        return Done(provider_request_id=f"<{run_id}@mail.example>")

    with client.lease(run_id, ttl_s=3, owner_id=os.environ["OWNER_ID"]) as lease:
        done = lease.operation(
            tool="email",
            action="send",
            resource="mailto:ops@example.com",
            effect_class="NON_RETRYABLE",
            idempotency_key=f"mail:{run_id}",
            perform=send,
        )
        if os.environ.get("STOP_AFTER_OUTCOME"):
            print("STORED", done["phase"], flush=True)
            time.sleep(600)  # the test kills the process here
        print("DECIDED", done["phase"], flush=True)
        lease.checkpoint("sent", {"sent": True})
        lease.complete()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
