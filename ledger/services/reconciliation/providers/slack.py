"""Slack: a message found by its metadata in the channel's history.

The worker posts with ``chat.postMessage(..., metadata=slack_metadata(key))``
(``{"event_type": "fenceline_effect", "event_payload": {"fenceline_key": KEY}}``,
``fenceline_client.provider_tags``) to the channel the operation's ``resource`` names:
``C0123ABCD``, or ``C0123ABCD/1712345678.000100`` for a reply in that thread. The lookup reads
the messages since the intent (less ``since_margin_s``):

    GET /conversations.history?channel=C..&oldest=...&limit=200&include_all_metadata=true[&cursor=...]
    GET /conversations.replies?channel=C..&ts=THREAD&oldest=...&limit=200&include_all_metadata=true  (a thread)

following ``response_metadata.next_cursor``. One message whose metadata carries the key:
HAPPENED (its ``ts``); none: DID_NOT_HAPPEN; two: CANNOT_TELL; ``{"ok": false, "error": ...}``
(``channel_not_found``, ``not_in_channel``, ``missing_scope``...): CANNOT_TELL with the error
code. A 429 waits for its Retry-After (``wire.py``).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from fenceline_client.provider_tags import SLACK_EVENT_TYPE, SLACK_PAYLOAD_KEY
from ledger.models import Operation
from ledger.services.reconciliation.protocol import Lookup, Verdict
from ledger.services.reconciliation.providers import (
    cannot_tell,
    json_of,
    required_credential,
    seen,
    settings_of,
    short_code,
    since,
)
from ledger.services.reconciliation.wire import WIRE_DEFAULTS, Answer, Wire

DEFAULTS: dict[str, Any] = {
    "base_url": "https://slack.com/api",
    "auth": None,
    "event_type": SLACK_EVENT_TYPE,
    "max_pages": 20,
    "since_margin_s": 300,
    **WIRE_DEFAULTS,
}
RESOURCE = re.compile(r"^(?:slack:)?(?P<channel>[A-Z0-9]{2,32})(?:/(?P<thread>[0-9]{1,12}\.[0-9]{1,8}))?$")


class SlackReconciler:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.config = settings_of(name, config, DEFAULTS)
        self.wire = Wire(
            name, self.config["base_url"], credential=required_credential(name, self.config), options=self.config
        )

    def lookup(self, operation: Operation, *, request_id: str = "", now: datetime | None = None) -> Lookup:
        where = RESOURCE.match(operation.resource)
        if where is None:
            return Lookup(
                Verdict.CANNOT_TELL, asked="", why="the operation's resource names no Slack channel (C0123ABCD)"
            )
        oldest = f"{since(operation, self.config['since_margin_s']).timestamp():.6f}"
        params: dict[str, str | int] = {"channel": where["channel"], "oldest": oldest, "limit": 200}
        method = "/conversations.history"
        if where["thread"]:
            method, params["ts"] = "/conversations.replies", where["thread"]
        params["include_all_metadata"] = "true"
        found: list[dict[str, Any]] = []
        first: Answer | None = None
        for page in range(1, int(self.config["max_pages"]) + 1):
            answer = self.wire.get(method, params)
            first = first or answer
            document = json_of(answer)
            if answer.status != 200 or not isinstance(document, dict):
                return cannot_tell(answer, f"Slack answered status {answer.status}")
            if document.get("ok") is not True or not isinstance(document.get("messages"), list):
                code = short_code(document.get("error"))
                return cannot_tell(answer, "Slack answered ok: false", **({"error_code": code} if code else {}))
            found += [m for m in document["messages"] if isinstance(m, dict) and self._carries(m, operation)]
            cursor = (document.get("response_metadata") or {}).get("next_cursor")
            if not cursor or not isinstance(cursor, str):
                return _verdict(found, first, where["channel"], page)
            params = {**params, "cursor": cursor}
        return cannot_tell(first or answer, f"more than {self.config['max_pages']} pages of messages")

    def _carries(self, message: dict[str, Any], operation: Operation) -> bool:
        metadata = message.get("metadata")
        if not isinstance(metadata, dict) or metadata.get("event_type") != self.config["event_type"]:
            return False
        payload = metadata.get("event_payload")
        return isinstance(payload, dict) and payload.get(SLACK_PAYLOAD_KEY) == operation.idempotency_key


def _verdict(found: list[dict[str, Any]], answer: Answer, channel: str, pages: int) -> Lookup:
    stamps = [str(m.get("ts", ""))[:40] for m in found]
    read: dict[str, Any] = {"channel": channel, "message_ts": stamps, "pages": pages}
    if len(found) > 1:
        return cannot_tell(answer, f"{len(found)} messages carry the key", **read)
    if found:
        why = f"message {stamps[0]} in {channel} carries the key"
        return Lookup(Verdict.HAPPENED, why=why, provider_request_id=stamps[0], read=read, **seen(answer))
    return Lookup(Verdict.DID_NOT_HAPPEN, why="no message in the history carries the key", read=read, **seen(answer))
