"""The OpenAI Agents SDK adapter (issue 38, item 1) with the real ``openai-agents`` package, a
scripted model (no network, no LLM) and the live server: every tool call is a fenced operation,
a call that needs a person becomes the SDK's interruption carrying the Fenceline approval id,
the approver decides through the console's service, and the run resumes from a serialized
RunState, in the same process or after a restart, calling the tool once."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from agents import Agent, set_tracing_disabled
from agents.exceptions import UserError

from approvals.models import ApprovalRequest
from approvals.services.approvals import approval_decide
from fenceline_client import Client
from fenceline_client.adapters.fencing import RESULT_EVENT
from fenceline_client.adapters.openai_agents import ApprovalPending, EffectUncertain, FencedAgentRun, Reported
from fenceline_client.client import Done, LeaseHeld
from ledger.models import Event, Operation
from tests.clients.adapters.scripted import ScriptedModel, message, tool_call
from tests.factories import make_worker, set_policy

ROOT = Path(__file__).resolve().parents[3]

set_tracing_disabled(True)  # nothing is exported anywhere


@pytest.fixture
def worker(live_server, acme):
    return Client(live_server.url, acme.token)


@pytest.fixture
def charges_need_a_person(acme):
    set_policy(acme.tenant, human_approval_tools=["charge"], reason="every charge is approved by a person")


class Ledger:
    """The tool's real calls, counted where the tool runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def charge(self, customer: str, cents: int) -> Reported:
        """Charge a customer."""
        self.calls.append((customer, cents))
        return Reported(f"charged {customer} {cents}", Done(provider_request_id=f"ch_{len(self.calls)}"))

    def lookup(self, customer: str) -> str:
        """Look a customer up."""
        self.calls.append((customer, 0))
        return f"{customer}: {len(self.calls)} lookups so far"


def billing_agent(fenced: FencedAgentRun, ledger: Ledger, turns: list) -> Agent:
    return Agent(
        name="billing",
        model=ScriptedModel(turns),
        tools=[
            fenced.tool(
                ledger.charge,
                name="charge",
                action="charge",
                resource=lambda args: f"customer:{args['customer']}",
                effect_class="NON_RETRYABLE",
            ),
            fenced.tool(ledger.lookup, name="lookup", action="read", resource="crm", effect_class="IDEMPOTENT"),
        ],
    )


def charge_turns() -> list:
    return [[tool_call("charge", {"customer": "881", "cents": 500}, "call_1")], [message("charged")]]


def dispatches(run_id: str) -> int:
    return Event.objects.filter(run_id=run_id, type="OPERATION_DISPATCHED").count()


def outputs_given_to_the_model(model: ScriptedModel) -> list[str]:
    return [item["output"] for item in model.inputs[-1] if item.get("type") == "function_call_output"]


def test_every_tool_call_is_an_operation_and_a_rerun_replays_instead_of_repeating(worker, live_server, acme):
    run_id = worker.create_run(external_id="agents-replay")
    turns = [
        [tool_call("lookup", {"customer": "881"}, "a"), tool_call("lookup", {"customer": "881"}, "b")],
        [message("looked up twice")],
    ]
    ledger = Ledger()
    with FencedAgentRun(worker, run_id) as fenced:
        agent = billing_agent(fenced, ledger, [list(turn) for turn in turns])
        result = fenced.run_sync(agent, "look customer 881 up twice")
        first = outputs_given_to_the_model(agent.model)
    assert result.final_output == "looked up twice"
    assert len(ledger.calls) == 2  # the same arguments twice: two calls, ordinals 0 and 1
    keys = sorted(Operation.objects.filter(run_id=run_id).values_list("idempotency_key", "phase"))
    assert [phase for _, phase in keys] == ["CONFIRMED", "CONFIRMED"]
    assert [key.rsplit("#", 1)[1] for key, _ in keys] == ["0", "1"]
    assert Event.objects.filter(run_id=run_id, type=RESULT_EVENT).count() == 2

    # A re-run of the same agent run (a new lease, new call ids from the model) replays both.
    turns[0] = [tool_call("lookup", {"customer": "881"}, "c"), tool_call("lookup", {"customer": "881"}, "d")]
    with FencedAgentRun(Client(live_server.url, acme.token), run_id) as again:
        agent = billing_agent(again, ledger, turns)
        again.run_sync(agent, "look customer 881 up twice")
        assert outputs_given_to_the_model(agent.model) == first  # the kept outputs, not new ones
    assert len(ledger.calls) == 2
    assert Operation.objects.filter(run_id=run_id).count() == 2 and dispatches(run_id) == 2


def test_an_approval_becomes_the_interruption_and_the_call_runs_once_after_the_decision(
    worker, charges_need_a_person, approver
):
    run_id = worker.create_run(external_id="agents-approval")
    ledger = Ledger()
    with FencedAgentRun(worker, run_id) as fenced:
        agent = billing_agent(fenced, ledger, charge_turns())
        result = fenced.run_sync(agent, "charge customer 881 five dollars")
        (item,) = result.interruptions
        approval_id = fenced.approval_id(item)
        pending = ApprovalRequest.objects.get(run_id=run_id)
        assert (str(pending.pk), pending.status) == (approval_id, "PENDING")
        assert ledger.calls == []

        # Approving in the SDK alone runs nothing: the tool asks Fenceline, which still waits.
        state = result.to_state()
        local = fenced.restore_sync(agent, state.to_string())
        local.approve(local.get_interruptions()[0])
        with pytest.raises(ApprovalPending) as waiting:
            fenced.run_sync(agent, local)
        assert waiting.value.approval_id == approval_id and ledger.calls == []

        approval_decide(approval_id=approval_id, approve=True, reason="invoice 17 checked", user=approver)
        state = fenced.wait_sync(state, timeout_s=10, poll_s=0.1)
        result = fenced.run_sync(agent, state)
    assert result.final_output == "charged"
    assert ledger.calls == [("881", 500)]
    operation = Operation.objects.get(run_id=run_id)
    assert (operation.phase, operation.provider_request_id) == ("CONFIRMED", "ch_1")
    assert dispatches(run_id) == 1
    assert ApprovalRequest.objects.get(pk=approval_id).status == "USED"


def test_a_denied_call_is_rejected_and_never_runs(worker, charges_need_a_person, approver):
    run_id = worker.create_run()
    ledger = Ledger()
    with FencedAgentRun(worker, run_id) as fenced:
        agent = billing_agent(fenced, ledger, charge_turns())
        result = fenced.run_sync(agent, "charge customer 881 five dollars")
        approval_decide(
            approval_id=fenced.approval_id(result.interruptions[0]), approve=False, reason="no", user=approver
        )
        state = fenced.wait_sync(result.to_state(), timeout_s=10, poll_s=0.1)
        result = fenced.run_sync(agent, state)
    assert ledger.calls == [] and dispatches(run_id) == 0
    assert "denied" in outputs_given_to_the_model(agent.model)[0]


def _wait_for_pending(run_id: str, process: subprocess.Popen) -> ApprovalRequest:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = ApprovalRequest.objects.filter(run_id=run_id, status="PENDING").first()
        if found is not None:
            return found
        assert process.poll() is None, process.communicate()
        time.sleep(0.1)
    raise AssertionError("the restarted worker asked for no approval")


def test_a_restarted_worker_resumes_from_the_serialized_state_and_calls_the_tool_once(
    worker, live_server, acme, charges_need_a_person, approver, tmp_path
):
    run_id = worker.create_run(external_id="agents-restart")
    ledger = Ledger()
    with FencedAgentRun(worker, run_id) as fenced:
        agent = billing_agent(fenced, ledger, charge_turns())
        result = fenced.run_sync(agent, "charge customer 881 five dollars")
        first_approval = fenced.approval_id(result.interruptions[0])
        saved = result.to_state().to_string()
    # The process ends: its lease is released, and the approval asked under its token is void.
    assert ApprovalRequest.objects.get(pk=first_approval).status == "VOID"
    (tmp_path / "state.json").write_text(saved)
    calls = tmp_path / "calls.txt"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.clients.adapters.openai_agent_process",
            live_server.url,
            acme.token,
            run_id,
            str(tmp_path / "state.json"),
            str(calls),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        asked = _wait_for_pending(run_id, process)
        approval_decide(approval_id=asked.pk, approve=True, reason="checked after the restart", user=approver)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert f"waiting {asked.pk}" in out and "final charged after the restart" in out
    assert calls.read_text().splitlines() == ["881 500"]
    assert ledger.calls == []  # the first process never ran it
    assert dispatches(run_id) == 1
    assert Operation.objects.get(run_id=run_id).phase == "CONFIRMED"


def test_a_resume_from_a_state_saved_before_the_call_ran_replays_it(
    worker, live_server, acme, charges_need_a_person, approver
):
    """The worker crashed after the tool ran and before it saved a newer state: the state it
    resumes from still holds the approved call, and Fenceline's replay keeps it from running again."""
    run_id = worker.create_run()
    ledger = Ledger()
    with FencedAgentRun(worker, run_id) as fenced:
        agent = billing_agent(fenced, ledger, charge_turns())
        result = fenced.run_sync(agent, "charge customer 881 five dollars")
        approval_decide(
            approval_id=fenced.approval_id(result.interruptions[0]), approve=True, reason="ok", user=approver
        )
        state = fenced.wait_sync(result.to_state(), timeout_s=10, poll_s=0.1)
        stale = state.to_string()  # approved, the call not yet made
        fenced.run_sync(agent, state)
    assert ledger.calls == [("881", 500)]

    with FencedAgentRun(Client(live_server.url, acme.token), run_id) as restarted:
        agent = billing_agent(restarted, ledger, charge_turns()[1:])
        state = restarted.restore_sync(agent, stale)
        result = restarted.run_sync(agent, state)
        given = outputs_given_to_the_model(agent.model)
    assert result.final_output == "charged"
    assert given == ["charged 881 500"]  # the output kept by the first attempt
    assert ledger.calls == [("881", 500)]
    assert dispatches(run_id) == 1


def test_the_lease_is_held_while_the_runner_runs(worker, live_server):
    run_id = worker.create_run()
    other = Client(live_server.url, make_worker("acme", "worker-2").token)
    refusals = []

    def lookup(customer: str) -> str:
        """Look a customer up."""
        try:
            other.lease(run_id).__enter__()
        except LeaseHeld as held:
            refusals.append(held.code)
        return "ok"

    with FencedAgentRun(worker, run_id) as fenced:
        agent = Agent(
            name="crm",
            model=ScriptedModel([[tool_call("lookup", {"customer": "881"}, "a")], [message("done")]]),
            tools=[fenced.tool(lookup, action="read", resource="crm", effect_class="IDEMPOTENT")],
        )
        fenced.run_sync(agent, "look 881 up")
    assert refusals == ["LEASE_HELD"]


def test_a_tool_that_raises_leaves_its_operation_unknown_and_a_rerun_stops_on_it(worker, live_server, acme):
    run_id = worker.create_run()

    def charge(customer: str, cents: int) -> str:
        """Charge a customer."""
        raise TimeoutError("the provider did not answer")

    def run(client: Client) -> None:
        with FencedAgentRun(client, run_id) as fenced:
            tool = fenced.tool(charge, action="charge", resource="customer:881", effect_class="NON_RETRYABLE")
            agent = Agent(name="billing", model=ScriptedModel(charge_turns()), tools=[tool])
            fenced.run_sync(agent, "charge customer 881 five dollars")

    with pytest.raises(UserError, match="the provider did not answer"):
        run(worker)
    assert Operation.objects.get(run_id=run_id).phase == "UNKNOWN"
    with pytest.raises(EffectUncertain) as uncertain:
        run(Client(live_server.url, acme.token))
    assert uncertain.value.operation_id == str(Operation.objects.get(run_id=run_id).pk)
    assert dispatches(run_id) == 1
