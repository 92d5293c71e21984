"""A run's chain as one JSON document, streamed: what the worker API's
``GET /api/v1/runs/{run_id}/events`` and the console's "export chain" answer, and what the
standalone verifier (``fenceline_client.evidence_verifier``) checks anywhere."""

import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any

from fenceline_client.evidence_verifier import PAYLOAD_VERSION, REMOVED_BY_RETENTION
from ledger.chain import event_document, format_time
from ledger.models import Checkpoint, DiagnosticPayload, Event, Run

EXPORT_CHUNK = 2000


def chain_export(run: Run, *, payloads: bool = True) -> Iterator[str]:
    """{"run_id", "head", "events": [...], "checkpoints": [...]}, in pieces: each event
    with every field of the canonical form, its hash and its MAC (with the id of the event
    key it is under), up to the head as read when the export began. An event that commits
    to a diagnostic payload by digest (schema version 2) also carries, outside its canonical
    form, its ``payload`` (``payloads``: the reader may see the diagnostic plane), else
    ``payload_withheld``; or ``payload_removed`` once retention removed it."""
    head = {"last_seq": run.last_seq, "last_hash": run.last_hash}
    yield f'{{"run_id":{json.dumps(str(run.pk))},"head":{json.dumps(head)},"events":['
    rows = Event.objects.filter(run=run, seq__lte=head["last_seq"]).order_by("seq").iterator(chunk_size=EXPORT_CHUNK)
    first = True
    for chunk in itertools.batched(rows, EXPORT_CHUNK):
        kept = _payloads(run, chunk, payloads)
        for event in chunk:
            document = event_document(event)
            if event.schema_version == PAYLOAD_VERSION:
                document.update(kept.get(event.seq, {}))
            yield ("" if first else ",") + json.dumps(document, ensure_ascii=False, separators=(",", ":"))
            first = False
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


def _payloads(run: Run, events: Sequence[Event], readable: bool) -> dict[int, dict[str, Any]]:
    """What the export adds to each version-2 event of ``events``, by seq: nothing for a
    payload whose row is gone (the verifier's payload_missing)."""
    seqs = [event.seq for event in events if event.schema_version == PAYLOAD_VERSION]
    if not seqs:
        return {}
    added: dict[int, dict[str, Any]] = {}
    for seq, body, removed_at in DiagnosticPayload.objects.filter(run=run, seq__in=seqs).values_list(
        "seq", "body", "removed_at"
    ):
        if removed_at is not None:
            added[seq] = {"payload_removed": {"by": REMOVED_BY_RETENTION, "at": format_time(removed_at)}}
        elif readable:
            added[seq] = {"payload": body}
        else:
            added[seq] = {"payload_withheld": True}
    return added
