"""Events that workers append themselves (type NOTE or x.*), under the fence."""

from typing import Any

from ledger.models import Event, Worker
from ledger.services.core.fencing import Fenced, fenced
from ledger.services.evidence.append import validate_worker_event
from ledger.services.fence.ending import IN_FLIGHT


def event_append(*, worker: Worker, run_id: object, fencing_token: int, type: str, fields: dict[str, Any]) -> Event:
    fields = validate_worker_event(type, fields)

    def write(ctx: Fenced) -> Event:
        return ctx.batch.append(ctx.run, type, actor=ctx.actor, fields=fields)

    return fenced(
        worker=worker,
        run_id=run_id,
        fencing_token=fencing_token,
        attempted="event.append",
        write=write,
        ending=IN_FLIGHT,
    )
