"""A run's chain as one JSON document, streamed: what the worker API's
``GET /api/v1/runs/{run_id}/events`` and the console's "export chain" answer, and what the
standalone verifier (``fenceline_client.evidence_verifier``) checks anywhere."""

import json
from collections.abc import Iterator

from ledger.chain import event_document
from ledger.models import Checkpoint, Event, Run


def chain_export(run: Run) -> Iterator[str]:
    """{"run_id", "head", "events": [...], "checkpoints": [...]}, in pieces: each event
    with every field of the canonical form, its hash and its MAC (with the id of the event
    key it is under), up to the head as read when the export began."""
    head = {"last_seq": run.last_seq, "last_hash": run.last_hash}
    yield f'{{"run_id":{json.dumps(str(run.pk))},"head":{json.dumps(head)},"events":['
    rows = Event.objects.filter(run=run, seq__lte=head["last_seq"]).order_by("seq").iterator(chunk_size=2000)
    for index, event in enumerate(rows):
        yield ("," if index else "") + json.dumps(event_document(event), ensure_ascii=False, separators=(",", ":"))
    sealed = Checkpoint.objects.filter(run=run, seq__lte=head["last_seq"]).order_by("seq")
    yield '],"checkpoints":{}}}'.format(
        json.dumps(
            [
                {
                    "run_id": str(run.pk),
                    "seq": cp.seq,
                    "last_hash": cp.last_hash,
                    "verifier_version": cp.verifier_version,
                    "key_id": cp.key_id,
                    "mac": cp.mac,
                }
                for cp in sealed
            ],
            separators=(",", ":"),
        )
    )
