"""A worker's delivery report: the delivery record (``ledger.services.delivery.record``)
written under the fence, as an outcome is."""

from ledger.errors import NotFound, parse_id
from ledger.models import Worker
from ledger.services.core.fencing import Fenced, fenced
from ledger.services.delivery.record import DeliveryReport, Recorded, delivery_write
from ledger.services.fence.ending import IN_FLIGHT


def delivery_record(*, worker: Worker, operation_id: object, fencing_token: int, report: DeliveryReport) -> Recorded:
    """The worker holding the run's lease records a delivery of the operation's current
    attempt, under the fence (a stale token: 409 STALE_TOKEN, recorded as every refusal is)."""
    op_id = parse_id(operation_id, "operation")

    def write(ctx: Fenced) -> Recorded:
        if ctx.operation is None:
            raise NotFound("operation not found")
        return delivery_write(run=ctx.run, op=ctx.operation, report=report, batch=ctx.batch, actor=ctx.actor)

    return fenced(
        worker=worker,
        operation_id=op_id,
        fencing_token=fencing_token,
        attempted="operation.delivery",
        write=write,
        ending=IN_FLIGHT,
    )
