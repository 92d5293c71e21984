"""Progress checkpoints: the lease owner saves where its work stands, under the fence; the
next owner gets the latest with its lease and resumes from it (article "Agent Lifespan
Management", Draining -> Checkpointed).

``state`` is a JSON object of at most 64 KB that passes the storage check and the secret
boundary like event fields; the run's chain records each checkpoint's seq, position and the
digest of its state, so an auditor can tell which progress a replacement resumed from.
"""

from typing import Any

from django.db.models import Max

from ledger.boundary import check_text
from ledger.chain import canonical_json, hash_bytes
from ledger.errors import InvalidInput
from ledger.models import ProgressCheckpoint, Worker
from ledger.services.core.fencing import Fenced, fenced
from ledger.services.evidence.append import checked_document
from ledger.services.lifespan.instances import instance_checkpointed

MAX_STATE_BYTES = 64 * 1024
MAX_POSITION_LENGTH = 200


def state_digest(state: dict[str, Any]) -> str:
    """sha256 of the state's canonical JSON, the chain's own form (keys sorted, compact, UTF-8)."""
    return hash_bytes(canonical_json(state))


def _checked(position: object, state: object) -> tuple[str, dict[str, Any]]:
    if not isinstance(position, str) or not 1 <= len(position) <= MAX_POSITION_LENGTH:
        raise InvalidInput(f"position must be 1 to {MAX_POSITION_LENGTH} characters", field="position")
    check_text(position, path="position")
    return position, checked_document(state, field="state", max_bytes=MAX_STATE_BYTES)


def checkpoint_save(
    *, worker: Worker, run_id: object, fencing_token: int, position: str, state: dict[str, Any]
) -> ProgressCheckpoint:
    """Save the run's progress as its next checkpoint and record it in the chain."""
    position, state = _checked(position, state)
    digest = state_digest(state)

    def write(ctx: Fenced) -> ProgressCheckpoint:
        # The run row is locked: the next seq cannot be taken by anyone else.
        last = ProgressCheckpoint.objects.filter(run=ctx.run).aggregate(last=Max("seq"))["last"] or 0
        checkpoint = ProgressCheckpoint.objects.create(
            run=ctx.run,
            seq=last + 1,
            position=position,
            state=state,
            digest=digest,
            fencing_token=ctx.fencing_token,
            owner_id=ctx.lease.owner_id or "",
            created_at=ctx.now,
        )
        moved = instance_checkpointed(run=ctx.run, batch=ctx.batch)  # a draining instance is now Checkpointed
        ctx.batch.append(
            ctx.run,
            "PROGRESS_CHECKPOINTED",
            actor=ctx.actor,
            fields={
                "checkpoint_id": checkpoint.pk,
                "seq": checkpoint.seq,
                "position": position,
                "digest": digest,
                **({"instance_state": moved.value} if moved else {}),
            },
        )
        return checkpoint

    return fenced(worker=worker, run_id=run_id, fencing_token=fencing_token, attempted="checkpoint.save", write=write)
