"""The LangGraph adapter (issue 38, item 2) with the real ``langgraph`` package, a scripted model
node (no LLM) and the live server: tool calls are fenced operations, an approval-required call
interrupts the graph with the approval id, resuming after the decision does not repeat a
CONFIRMED effect, and Fenceline's progress checkpoint and LangGraph's checkpointer agree on
where a new lease resumes."""

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command

from approvals.models import ApprovalRequest
from approvals.services.approvals import approval_decide
from fenceline_client import Client, Done
from fenceline_client.adapters.langgraph import CheckpointMissing, FencedGraph, Reported
from ledger.models import Event, Operation
from tests.factories import set_policy


@pytest.fixture
def worker(live_server, acme):
    return Client(live_server.url, acme.token)


@pytest.fixture
def charges_need_a_person(acme):
    set_policy(acme.tenant, human_approval_tools=["charge"], reason="every charge is approved by a person")


class Provider:
    def __init__(self) -> None:
        self.charges: list[tuple[str, int]] = []
        self.lookups: list[str] = []

    def charge(self, customer: str, cents: int) -> Reported:
        self.charges.append((customer, cents))
        return Reported(f"charged {customer} {cents}", Done(provider_request_id=f"ch_{len(self.charges)}"))

    def lookup(self, customer: str) -> str:
        self.lookups.append(customer)
        return f"{customer} is in good standing (lookup {len(self.lookups)})"


def call(name: str, call_id: str, **args) -> dict:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


SCRIPT = [
    AIMessage("", tool_calls=[call("lookup", "c1", customer="881"), call("charge", "c2", customer="881", cents=500)]),
    AIMessage("charged customer 881"),
]


def build(fenced: FencedGraph, provider: Provider, checkpointer, script=SCRIPT):
    def model(state: MessagesState) -> dict:  # scripted: turn n answers script[n]
        turn = sum(isinstance(message, AIMessage) for message in state["messages"])
        return {"messages": [script[turn]]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    tools = fenced.tool_node(
        [
            fenced.tool(
                provider.charge,
                action="charge",
                resource=lambda args: f"customer:{args['customer']}",
                effect_class="NON_RETRYABLE",
            ),
            fenced.tool(provider.lookup, action="read", resource="crm", effect_class="IDEMPOTENT"),
        ]
    )
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def dispatches(run_id: str) -> int:
    return Event.objects.filter(run_id=run_id, type="OPERATION_DISPATCHED").count()


def tool_answers(values: dict) -> dict[str, str]:
    return {m.name: m.content for m in values["messages"] if isinstance(m, ToolMessage)}


START_INPUT = {"messages": [HumanMessage("charge customer 881 five dollars")]}


def test_an_approval_interrupts_the_graph_and_the_resume_does_not_repeat_the_confirmed_call(
    worker, charges_need_a_person, approver
):
    run_id = worker.create_run(external_id="graph-approval")
    provider, saver = Provider(), InMemorySaver()
    with FencedGraph(worker, run_id) as fenced:
        graph = build(fenced, provider, saver)
        paused = fenced.invoke(graph, START_INPUT)
        (interrupted,) = paused["__interrupt__"]
        (waiting,) = fenced.waiting(graph)
        assert interrupted.value == waiting
        assert ApprovalRequest.objects.get(pk=waiting["approval_id"]).status == "PENDING"
        assert (waiting["tool"], waiting["args"]) == ("charge", {"customer": "881", "cents": 500})
        assert provider.lookups == ["881"] and provider.charges == []

        # Resumed before anyone decided: the node runs again, the lookup replays, it interrupts again.
        again = fenced.invoke(graph, Command(resume="not yet"))
        assert again["__interrupt__"][0].value["approval_id"] == waiting["approval_id"]

        approval_decide(approval_id=waiting["approval_id"], approve=True, reason="invoice checked", user=approver)
        done = fenced.invoke(graph, Command(resume="approved"))
    assert done["messages"][-1].content == "charged customer 881"
    assert provider.lookups == ["881"] and provider.charges == [("881", 500)]
    answers = tool_answers(done)
    assert answers == {"lookup": "881 is in good standing (lookup 1)", "charge": "charged 881 500"}
    assert dispatches(run_id) == 2
    charge = Operation.objects.get(run_id=run_id, tool="charge")
    assert (charge.phase, charge.provider_request_id) == ("CONFIRMED", "ch_1")


def test_a_new_lease_resumes_from_the_langgraph_checkpoint_fenceline_saved(
    worker, live_server, acme, charges_need_a_person, approver
):
    run_id = worker.create_run(external_id="graph-restart")
    provider, saver = Provider(), InMemorySaver()
    with FencedGraph(worker, run_id) as fenced:
        graph = build(fenced, provider, saver)
        fenced.invoke(graph, START_INPUT)
        saved = fenced.lease.checkpoint_state["langgraph"]
        latest = graph.get_state({"configurable": {"thread_id": run_id}}).config["configurable"]
        assert saved["checkpoint_id"] == latest["checkpoint_id"]  # the two agree
        first = fenced.waiting(graph)[0]["approval_id"]
    assert ApprovalRequest.objects.get(pk=first).status == "VOID"  # asked under the old lease

    # A new process: a new client, lease and graph object over the same checkpointer.
    with FencedGraph(Client(live_server.url, acme.token), run_id) as resumed:
        assert resumed.config["configurable"]["checkpoint_id"] == saved["checkpoint_id"]
        graph = build(resumed, provider, saver)
        asked = resumed.invoke(graph, Command(resume="restarted"))["__interrupt__"][0].value["approval_id"]
        assert asked != first and ApprovalRequest.objects.get(pk=asked).status == "PENDING"
        approval_decide(approval_id=asked, approve=True, reason="checked after the restart", user=approver)
        done = resumed.invoke(graph, Command(resume="approved"))
    assert done["messages"][-1].content == "charged customer 881"
    assert provider.lookups == ["881"] and provider.charges == [("881", 500)]
    assert dispatches(run_id) == 2


def test_a_resume_from_an_older_fenceline_checkpoint_replays_the_effects_after_it(worker, live_server, acme):
    """The worker crashed after LangGraph checkpointed the tool step and before Fenceline did:
    the next lease resumes from Fenceline's (older) checkpoint, runs the tool step again, and the
    calls it makes replay instead of repeating."""
    run_id = worker.create_run(external_id="graph-behind")
    provider, saver = Provider(), InMemorySaver()
    with FencedGraph(worker, run_id) as fenced:
        graph = build(fenced, provider, saver)
        first = fenced.invoke(graph, START_INPUT)
    assert provider.charges == [("881", 500)] and dispatches(run_id) == 2
    history = list(graph.get_state_history({"configurable": {"thread_id": run_id}}))
    before_tools = next(snapshot for snapshot in history if snapshot.next == ("tools",))
    with FencedGraph(worker, run_id) as behind:  # Fenceline's last checkpoint: before the tool step
        behind._save({"config": before_tools.config, "metadata": before_tools.metadata, "next": before_tools.next})

    with FencedGraph(Client(live_server.url, acme.token), run_id) as resumed:
        assert resumed.config["configurable"]["checkpoint_id"] == before_tools.config["configurable"]["checkpoint_id"]
        graph = build(resumed, provider, saver)
        done = resumed.invoke(graph, None)
        assert resumed.lease.checkpoint_state["step"] > before_tools.metadata["step"]  # the steps ran again
    assert tool_answers(done) == tool_answers(first)  # the kept outputs
    assert provider.lookups == ["881"] and provider.charges == [("881", 500)]
    assert dispatches(run_id) == 2 and Operation.objects.filter(run_id=run_id).count() == 2


def test_a_checkpoint_the_checkpointer_does_not_hold_is_refused(worker, live_server, acme):
    run_id = worker.create_run()
    provider = Provider()
    with FencedGraph(worker, run_id) as fenced:
        fenced.invoke(build(fenced, provider, InMemorySaver()), START_INPUT)
    with FencedGraph(Client(live_server.url, acme.token), run_id) as resumed, pytest.raises(CheckpointMissing):
        resumed.invoke(build(resumed, provider, InMemorySaver()), None)  # another, empty checkpointer
    assert provider.charges == [("881", 500)]


def test_a_denied_call_answers_the_model_with_the_refusal_and_never_runs(worker, charges_need_a_person, approver):
    run_id = worker.create_run()
    provider = Provider()
    with FencedGraph(worker, run_id) as fenced:
        graph = build(fenced, provider, InMemorySaver())
        fenced.invoke(graph, START_INPUT)
        (waiting,) = fenced.waiting(graph)
        approval_decide(approval_id=waiting["approval_id"], approve=False, reason="not this one", user=approver)
        fenced.wait(graph, timeout_s=10, poll_s=0.1)
        done = fenced.invoke(graph, Command(resume="denied"))
    refused = next(m for m in done["messages"] if isinstance(m, ToolMessage) and m.name == "charge")
    assert refused.status == "error" and "APPROVAL_DENIED" in refused.content
    assert provider.charges == [] and provider.lookups == ["881"]
    assert Operation.objects.get(run_id=run_id, tool="charge").phase == "DENIED"
