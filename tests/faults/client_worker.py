"""A worker process built on the Python client (fenceline_client), for the SIGTERM and
SIGKILL tests: submits items one operation each, checkpointing after each, and on SIGTERM
drains, checkpoints, releases and exits 0. ``PERFORM_S`` is how long one provider call takes;
it prints PERFORMING <n> as each call starts."""

import os
import signal
import sys
import time

from fenceline_client import Client, Done

stopping = False


def on_sigterm(signum, frame) -> None:
    global stopping
    stopping = True  # the main loop drains: a signal handler makes no HTTP call


def main(run_id: str) -> int:
    signal.signal(signal.SIGTERM, on_sigterm)
    client = Client(os.environ["FENCELINE_URL"], os.environ["FENCELINE_TOKEN"])
    perform_s = float(os.environ.get("PERFORM_S", "0.3"))
    with client.lease(run_id, ttl_s=5) as lease:
        done = list((lease.checkpoint_state or {}).get("done", []))
        for n in range(len(done) + 1, 1000):
            if stopping:
                client.drain(deadline_s=30, reason="SIGTERM")
                break

            def submit(n=n) -> Done:
                print("PERFORMING", n, flush=True)
                time.sleep(perform_s)
                return Done(provider_request_id=f"sub-{n}")

            lease.operation(
                tool="portal",
                action="submit",
                resource=f"item:{n}",
                effect_class="IDEMPOTENT",
                idempotency_key=f"submit:{run_id}:{n}",
                perform=submit,
            )
            done.append(n)
            if stopping:  # SIGTERM during the call: drain, then checkpoint, release, exit
                client.drain(deadline_s=30, reason="SIGTERM")
            lease.checkpoint(f"item-{n}", {"done": done})
            if stopping:
                break
    client.exit()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
