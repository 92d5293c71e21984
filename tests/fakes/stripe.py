"""Stripe's Search API for PaymentIntents (docs.stripe.com/api/payment_intents/search):

    GET /v1/payment_intents/{id}         200 the PaymentIntent, 404 {"error": {"code": "resource_missing"}}
    GET /v1/payment_intents/search?query=metadata['fenceline_key']:'KEY'&limit=N[&page=CURSOR]
    200 {"object": "search_result", "url": "/v1/payment_intents/search", "has_more": bool,
         "next_page": CURSOR | null, "data": [{"id": "pi_...", "object": "payment_intent",
         "status": ..., "amount": ..., "currency": ..., "metadata": {...}}]}
    400 {"error": {"type": "invalid_request_error", "code": "parameter_invalid_string", ...}}
    401 {"error": {"type": "invalid_request_error", "message": "Invalid API Key provided..."}}
    429 {"error": {"type": "invalid_request_error", "code": "rate_limit", ...}}

The fake understands only the metadata clause the reconciler sends (with Stripe's backslash
escapes), as the real one's query language does for it."""

from __future__ import annotations

import random
import re
import string
from typing import Any

from tests.fakes.base import FakeProvider, Reply

CLAUSE = re.compile(r"^metadata\['(?P<key>[^']+)'\]:'(?P<value>(?:[^'\\]|\\.)*)'$")


class FakeStripe(FakeProvider):
    def __init__(self, *, credential: str) -> None:
        super().__init__(credential=credential)
        self.intents: list[dict[str, Any]] = []

    def add(self, key: str, status: str, *, amount: int = 1200, metadata_key: str = "fenceline_key") -> dict[str, Any]:
        draw = random.Random(len(self.intents))  # noqa: S311 - ids shaped like Stripe's (pi_3 + 20 letters and digits)
        pid = "pi_3" + "".join(draw.choice(string.ascii_letters + string.digits) for _ in range(20))
        intent = {
            "id": pid,
            "object": "payment_intent",
            "amount": amount,
            "currency": "usd",
            "status": status,
            "metadata": {metadata_key: key},
            "client_secret": f"{pid}_secret_fakefakefake",
        }
        self.intents.append(intent)
        return intent

    def unauthorized(self) -> Reply:
        return Reply(401, {"error": {"type": "invalid_request_error", "message": "Invalid API Key provided"}})

    def route(self, path: str, query: dict[str, list[str]]) -> Reply:
        if path.startswith("/v1/payment_intents/") and path != "/v1/payment_intents/search":
            wanted = path.rsplit("/", 1)[1]
            found = next((i for i in self.intents if i["id"] == wanted), None)
            if found is None:
                return Reply(404, {"error": {"type": "invalid_request_error", "code": "resource_missing"}})
            return Reply(200, found)
        if path != "/v1/payment_intents/search":
            return Reply(404, {"error": {"type": "invalid_request_error", "message": "Unrecognized request URL"}})
        clause = CLAUSE.match(query.get("query", [""])[0])
        if clause is None:
            return Reply(400, {"error": {"type": "invalid_request_error", "code": "parameter_invalid_string"}})
        value = re.sub(r"\\(.)", r"\1", clause["value"])
        matching = [i for i in self.intents if i["metadata"].get(clause["key"]) == value]
        limit = int(query.get("limit", ["10"])[0])
        start = int(query["page"][0].removeprefix("page_")) if "page" in query else 0
        data, following = self.pages(matching, limit, start)
        return Reply(
            200,
            {
                "object": "search_result",
                "url": "/v1/payment_intents/search",
                "has_more": following is not None,
                "next_page": f"page_{following}" if following is not None else None,
                "data": data,
            },
        )
