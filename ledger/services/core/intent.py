"""An operation's intent as a worker states it: the parameters of a side effect before the
tenant's tool contract shapes them (``reconciliation/contracts.py``) and the fence records
them (``fence/operations.py``). Both rooms read it; it imports neither."""

from dataclasses import dataclass

from ledger.states import EffectClass


@dataclass(frozen=True, kw_only=True)
class Intent:
    tool: str
    action: str
    resource: str
    idempotency_key: str
    # None: the tool contract gives it (ledger/services/reconciliation/contracts.py).
    effect_class: EffectClass | None = None
    args_digest: str = ""
    provider: str = ""
    estimated_cost_cents: int | None = None
    payload_bytes: int | None = None
    # The flow-control key the worker names ('' for none): the policy's "key:<flow_key>" or
    # "key:*" limits it at dispatch (ledger/services/authority/flow.py).
    flow_key: str = ""
