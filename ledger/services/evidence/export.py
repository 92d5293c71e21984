"""A run's chain as one JSON document, streamed: what the worker API's
``GET /api/v1/runs/{run_id}/events`` and the console's "export chain" answer, and what the
standalone verifier (``fenceline_client.evidence_verifier``) checks anywhere."""

import json
from collections.abc import Iterator

from ledger.chain import format_time
from ledger.models import Checkpoint, Event, Run


def chain_export(run: Run) -> Iterator[str]:
    """{"run_id", "head", "events": [...], "checkpoints": [...]}, in pieces: each event
    with every field of the canonical form, its hash and its MAC (with the id of the event
    key it is under), up to the head as read when the export began."""
    head = {"last_seq": run.last_seq, "last_hash": run.last_hash}
    yield f'{{"run_id":{json.dumps(str(run.pk))},"head":{json.dumps(head)},"events":['
    rows = Event.objects.filter(run=run, seq__lte=head["last_seq"]).order_by("seq").iterator(chunk_size=2000)
    for index, event in enumerate(rows):
        yield ("," if index else "") + json.dumps(
            {
                "run_id": str(event.run_id),
                "seq": event.seq,
                "event_id": str(event.event_id),
                "type": event.type,
                "schema_version": event.schema_version,
                "actor": event.actor,
                "occurred_at": format_time(event.occurred_at),
                "fields": event.fields,
                "prev_hash": event.prev_hash,
                "hash": event.hash,
                "mac_key_id": event.mac_key_id,
                "mac": event.mac,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
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
