"""The shared part of the adapters (no framework, no server): how a tool call is named, so that
a resumed or re-run agent names the same operations."""

from fenceline_client.adapters.fencing import Ordinals, args_digest, idempotency_key

RUN = "3f1c2a7e-0000-4000-8000-000000000001"


def test_a_key_names_the_run_the_tool_the_canonical_arguments_and_the_ordinal():
    key = idempotency_key(RUN, "charge", {"cents": 500, "customer": "881"}, 0)
    assert key == idempotency_key(RUN, "charge", {"customer": "881", "cents": 500}, 0)  # key order does not count
    assert key.startswith(f"{RUN}:charge:") and key.endswith("#0")
    others = {
        idempotency_key(RUN, "charge", {"customer": "881", "cents": 501}, 0),
        idempotency_key(RUN, "charge", {"customer": "881", "cents": 500}, 1),
        idempotency_key(RUN, "refund", {"customer": "881", "cents": 500}, 0),
        idempotency_key(RUN.replace("1", "2"), "charge", {"customer": "881", "cents": 500}, 0),
    }
    assert key not in others and len(others) == 4
    assert len(idempotency_key(RUN, "t" * 100, {"x": "y" * 1000}, 12345)) <= 200  # the server's limit
    assert args_digest({"a": 1}).startswith("sha256:") and len(args_digest({"a": 1})) == 71


def test_ordinals_count_earlier_calls_of_the_same_tool_and_arguments_in_history_order():
    ordinals = Ordinals()
    ordinals.observe([("a", "lookup", {"c": 1}), ("b", "lookup", {"c": 2}), ("c", "lookup", {"c": 1})])
    ordinals.observe([("a", "lookup", {"c": 1}), ("d", "charge", {"c": 1}), ("e", "lookup", {"c": 1})])  # a again
    assert [ordinals.of(call) for call in "abcde"] == [0, 0, 1, 0, 2]
    assert ordinals.of("unseen") is None
