"""Events that workers append themselves (type NOTE or x.*), under the fence."""

from typing import Any

from ledger.models import Event, Worker
from ledger.services.core.fencing import Fenced, fenced
from ledger.services.evidence.append import validate_worker_event
from ledger.services.evidence.planes import EVENT_PAYLOAD, checked_payload, payload_append
from ledger.services.fence.ending import IN_FLIGHT


def event_append(
    *,
    worker: Worker,
    run_id: object,
    fencing_token: int,
    type: str,
    fields: dict[str, Any],
    payload: dict[str, Any] | None = None,
    payload_class: str = EVENT_PAYLOAD,
) -> Event:
    """``fields`` go into the chain (the control plane, kept for good); ``payload``, if
    given, into the diagnostic plane, the chain committing to it by digest
    (``ledger.services.evidence.planes``)."""
    fields = validate_worker_event(type, fields)
    if payload is not None:
        payload = checked_payload(worker.tenant, fields, payload, payload_class)

    def write(ctx: Fenced) -> Event:
        if payload is None:
            return ctx.batch.append(ctx.run, type, actor=ctx.actor, fields=fields)
        return payload_append(
            ctx.batch, ctx.run, type, actor=ctx.actor, fields=fields, payload=payload, klass=payload_class
        )

    return fenced(
        worker=worker,
        run_id=run_id,
        fencing_token=fencing_token,
        attempted="event.append",
        write=write,
        ending=IN_FLIGHT,
    )
