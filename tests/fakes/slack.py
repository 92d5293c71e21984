"""Slack's Web API conversations.history / conversations.replies (docs.slack.dev/reference/methods):

    GET /api/conversations.history?channel=C..&oldest=TS&limit=N&include_all_metadata=true[&cursor=..]
    200 {"ok": true, "messages": [{"type": "message", "user": "U..", "text": "...", "ts": "1712345678.000100",
         "metadata": {"event_type": ..., "event_payload": {...}}}], "has_more": bool,
         "response_metadata": {"next_cursor": "bmV4dF90czox..."}}
    200 {"ok": false, "error": "channel_not_found" | "not_in_channel" | "invalid_auth" ...}
    429 Retry-After: N (rate limited)

Slack answers a bad token with HTTP 200 and ``ok: false``; metadata is in a message only when
``include_all_metadata`` is true."""

from __future__ import annotations

import base64
from typing import Any

from tests.fakes.base import FakeProvider, Reply


class FakeSlack(FakeProvider):
    def __init__(self, *, credential: str) -> None:
        super().__init__(credential=credential)
        self.channels: dict[str, list[dict[str, Any]]] = {}
        self.replies: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.clock = 1_800_000_000

    def post(
        self, channel: str, text: str, metadata: dict[str, Any] | None = None, *, thread: str = ""
    ) -> dict[str, Any]:
        self.clock += 1
        message: dict[str, Any] = {"type": "message", "user": "U0BOT", "text": text, "ts": f"{self.clock}.000100"}
        if metadata is not None:
            message["metadata"] = metadata
        if thread:
            self.replies.setdefault((channel, thread), []).append(message)
        else:
            self.channels.setdefault(channel, []).insert(0, message)  # newest first, as Slack lists them
        return message

    def unauthorized(self) -> Reply:
        return Reply(200, {"ok": False, "error": "invalid_auth"})

    def route(self, path: str, query: dict[str, list[str]]) -> Reply:
        channel = query.get("channel", [""])[0]
        if path == "/api/conversations.history":
            messages = self.channels.get(channel)
        elif path == "/api/conversations.replies":
            messages = self.replies.get((channel, query.get("ts", [""])[0]))
        else:
            return Reply(404, {"ok": False, "error": "unknown_method"})
        if messages is None:
            return Reply(200, {"ok": False, "error": "channel_not_found"})
        oldest = float(query.get("oldest", ["0"])[0])
        with_metadata = query.get("include_all_metadata", ["false"])[0] == "true"
        listed = [
            m if with_metadata else {k: v for k, v in m.items() if k != "metadata"}
            for m in messages
            if float(m["ts"]) > oldest
        ]
        limit = int(query.get("limit", ["100"])[0])
        cursor = query.get("cursor", [""])[0]
        start = int(base64.b64decode(cursor).decode().removeprefix("next:")) if cursor else 0
        data, following = self.pages(listed, limit, start)
        next_cursor = base64.b64encode(f"next:{following}".encode()).decode() if following is not None else ""
        return Reply(
            200,
            {
                "ok": True,
                "messages": data,
                "has_more": following is not None,
                "response_metadata": {"next_cursor": next_cursor},
            },
        )
