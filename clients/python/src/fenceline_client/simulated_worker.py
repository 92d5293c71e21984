"""One simulated agent worker process, built on the Python client only (no Django):

    FENCELINE_URL=... FENCELINE_TOKEN=... PROVIDER_URL=... RUNS_FILE=runs.json \\
        python -m fenceline_client.simulated_worker [--bad-config] [--ttl 3] [--steps 4]

It boots with its readiness (the runtime domain carries the container self-audit) and
waits the restart delay the answer gives; then, until SIGTERM, it takes a run from
RUNS_FILE (a JSON list of run ids), resumes it from its checkpoint, and charges the sandbox
provider once per step under a stable idempotency key (``charge:<run>:<step>``),
checkpointing after each. SIGTERM only sets a flag; the main loop then drains, finishes
the step in flight, checkpoints, releases and reports its exit (exit code 0). The provider is
called through urllib3 with no retry of its own: a dropped answer is an outcome nobody knows.

``--old-build`` is a worker of the build before the operation.provider_ref change (it
reads version-1 operation records only and reports the bare provider id).

``--bad-config`` is the crash-looping worker: its runtime domain fails (a provider URL is
missing), it reports the config error and exits 3, to be restarted by its supervisor until
the restart budget quarantines it. Exit 4: quarantined; exit 5: told to stop.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import random
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any

import urllib3

from fenceline_client import client as fl

EXIT_BAD_CONFIG, EXIT_QUARANTINED, EXIT_TOLD_TO_STOP = 3, 4, 5
DOMAINS = ("state", "credentials", "outbound_delivery", "admission")


def say(*words: object) -> None:
    print(*words, flush=True)


class ProviderRefused(Exception):
    """The provider answered the charge with a status other than 200, 201 or 503."""


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # A rolling deploy mid-way: an old build reads operation records of version 1 only and
        # reports the provider's id as the bare string; the new one reads 1 and 2 and sends the
        # structured provider_ref. Both act side by side while the server is in EXPAND.
        self.reads = frozenset({1}) if args.old_build else fl.READS_SCHEMA_VERSIONS
        self.client = fl.Client(
            os.environ["FENCELINE_URL"], os.environ["FENCELINE_TOKEN"], timeout=10, reads=self.reads
        )
        self.provider = os.environ.get("PROVIDER_URL", "")
        self.http = urllib3.PoolManager(retries=False)  # one kept-alive pool to the provider
        self.runs_file = os.environ.get("RUNS_FILE", "")
        self.stopping = False
        self.random = random.Random()  # noqa: S311 - choosing work, not security

    def on_sigterm(self, signum: int, frame: object) -> None:
        self.stopping = True  # the main loop drains; a handler does nothing else

    # -- boot --

    def boot(self) -> dict[str, Any]:
        config = {"provider": self.provider, "ttl": self.args.ttl, "steps": self.args.steps}
        config_hash = "sha256:" + hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
        readiness = {domain: {"ok": True, "evidence": {}} for domain in DOMAINS}
        readiness["runtime"] = fl.runtime_readiness()
        error = None
        if self.args.bad_config:
            config_hash = "sha256:badc0nf16"
            readiness["runtime"] = {"ok": False, "evidence": {"config": "PROVIDER_URL is not set"}}
            error = {"kind": "config", "message": "PROVIDER_URL is not set", "at": datetime.now(UTC).isoformat()}
        build = "sim-1" if self.args.old_build else "sim-2"
        return self.client.boot(config_hash=config_hash, code_version=build, readiness=readiness, error=error)

    # -- work --

    def charge(self, key: str, step: int) -> fl.Done:
        response = self.http.request(
            "POST",
            self.provider + "/v1/charges",
            json={"amount_cents": 100 * (step + 1), "customer": key.split(":")[1][:8]},
            headers={"Idempotency-Key": key},
            timeout=float(self.args.ttl * 2),
        )  # a dropped answer raises here: the client reports the outcome UNKNOWN
        if response.status == 503:
            return fl.Done(outcome="FAILED", error_code="provider_unavailable")
        if response.status not in (200, 201):
            raise ProviderRefused(f"charge answered {response.status}")
        charged, cost = response.json()["id"], 100 * (step + 1)
        if self.args.old_build:
            return fl.Done(provider_request_id=charged, actual_cost_cents=cost)
        return fl.Done(provider_ref={"id": charged}, actual_cost_cents=cost)

    def runs(self) -> list[str]:
        with open(self.runs_file) as listing:
            return list(json.load(listing))

    def work_one(self, run_id: str) -> None:
        self.client.traceparent = fl.new_traceparent()  # one trace per lease: its events and operations share it
        with self.client.lease(run_id, ttl_s=self.args.ttl, tool="payments") as lease:
            state = lease.checkpoint_state or {"step": 0}
            say("LEASED", run_id, lease.token, "from", state["step"])
            for step in range(state["step"], self.args.steps):
                key = f"charge:{run_id}:{step}"
                result = lease.operation(
                    tool="payments",
                    action="charge",
                    resource=f"run:{run_id[:8]}",
                    effect_class="NON_RETRYABLE",
                    idempotency_key=key,
                    provider="sandbox-payments",
                    perform=functools.partial(self.charge, key, step),
                )
                say("STEP", run_id, step, result["phase"])
                lease.checkpoint(f"step-{step + 1}", {"step": step + 1})
                if self.stopping:
                    return  # drained at a checkpoint: the lease is released on the way out
                time.sleep(self.random.uniform(0.05, 0.3))
            lease.complete()
            say("COMPLETED", run_id)

    def loop(self) -> int:
        while not self.stopping:
            self.client.heartbeat()
            if self.client.stop_requested:
                return EXIT_TOLD_TO_STOP
            pending = self.runs()
            if not pending:
                time.sleep(0.5)
                continue
            try:
                self.work_one(self.random.choice(pending))
            except (fl.LeaseHeld, fl.RunCompleted, fl.RunCancelled, fl.IdempotencyMismatch):
                time.sleep(0.05)
            except (fl.StaleToken, fl.LeaseLost) as lost:
                say("FENCED", lost.code)  # it woke up after a pause: someone else owns the run now
            except (fl.ReconcileFirst, fl.NotReady, fl.ApprovalDenied, fl.Denied) as paused:
                say("PAUSED", paused.code)
                time.sleep(1)
            except fl.StopWorker:
                return EXIT_TOLD_TO_STOP
            except fl.WorkerNotAccepting:
                return EXIT_QUARANTINED
            except (
                urllib3.exceptions.HTTPError,
                ProviderRefused,
                fl.TransportError,
                fl.ServerError,
                fl.RetryLater,
            ) as outage:
                # the provider's or Fenceline's: an outcome it could not learn was reported UNKNOWN
                say("OUTAGE", type(outage).__name__)
                time.sleep(0.2)
        return self.drain()

    def drain(self) -> int:
        say("DRAINING")
        with contextlib.suppress(fl.WorkerNotAccepting):  # quarantined meanwhile: nothing to drain
            self.client.drain(deadline_s=15, reason="SIGTERM")
        try:
            self.client.exit()
        except fl.FencelineError as refused:
            say("EXIT_REFUSED", refused.code)
        say("EXITED")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bad-config", action="store_true")
    parser.add_argument("--old-build", action="store_true", help="the build before operation.provider_ref")
    parser.add_argument("--ttl", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    worker = Worker(args)
    signal.signal(signal.SIGTERM, worker.on_sigterm)
    answer = worker.boot()
    say("BOOTED", answer["phase"], answer["episode_boot"], answer["delay_s"], answer["worker_status"])
    if answer["quarantined"] or answer["worker_status"] == "QUARANTINED":
        return EXIT_QUARANTINED
    if args.bad_config:
        return EXIT_BAD_CONFIG
    return worker.loop()


if __name__ == "__main__":
    sys.exit(main())
