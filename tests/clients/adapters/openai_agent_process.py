"""A worker process of the restart test (tests/clients/adapters/test_openai_agents.py): it
restores an agent run from a serialized RunState, waits for Fenceline's decision on the
interruption, resumes, and appends one line to CALLS each time the tool's function really runs.

    python -m tests.clients.adapters.openai_agent_process URL TOKEN RUN_ID STATE_FILE CALLS_FILE
"""

import sys
from pathlib import Path

from agents import Agent, set_tracing_disabled

from fenceline_client import Client
from fenceline_client.adapters.openai_agents import FencedAgentRun
from tests.clients.adapters.scripted import ScriptedModel, message

set_tracing_disabled(True)


def main() -> None:
    url, token, run_id, state_file, calls_file = sys.argv[1:6]
    calls = Path(calls_file)

    def charge(customer: str, cents: int) -> str:
        """Charge a customer."""
        with calls.open("a") as seen:
            seen.write(f"{customer} {cents}\n")
        return f"charged {customer} {cents}"

    with FencedAgentRun(Client(url, token), run_id, ttl_s=10) as fenced:
        agent = Agent(
            name="billing",
            model=ScriptedModel([[message("charged after the restart")]]),
            tools=[fenced.tool(charge, action="charge", resource="customer:881", effect_class="NON_RETRYABLE")],
        )
        state = fenced.restore_sync(agent, Path(state_file).read_text())
        waiting = fenced.approval_id(state.get_interruptions()[0])
        print(f"waiting {waiting}", flush=True)
        fenced.wait_sync(state, timeout_s=60, poll_s=0.2)
        result = fenced.run_sync(agent, state)
        print(f"final {result.final_output}", flush=True)
        fenced.lease.complete()


if __name__ == "__main__":
    main()
