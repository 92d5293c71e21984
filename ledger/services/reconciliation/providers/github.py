"""GitHub: an issue or pull-request comment found by a hidden marker with the operation's key.

The worker writes the comment with ``github_marker(key)`` (``<!-- fenceline:KEY -->``,
``fenceline_client.provider_tags``) in its body, on the issue or pull request the operation's
``resource`` names: ``owner/repo#123``, ``owner/repo/issues/123`` or ``owner/repo/pull/123``.
The lookup lists the comments made since the intent (less ``since_margin_s``):

    GET /repos/{owner}/{repo}/issues/{number}/comments?per_page=100&since=...   ("comments": "issue",
                          the default: issues' comments and pull requests' conversation comments)
    GET /repos/{owner}/{repo}/pulls/{number}/comments?per_page=100&since=...    ("comments": "review")

following the ``Link: <...>; rel="next"`` pages. One comment with the marker: HAPPENED (its id);
none: DID_NOT_HAPPEN; two: CANNOT_TELL (the effect was made twice); a 404 (no such issue, or
the credential cannot see it): CANNOT_TELL. Rate limits: a 429, or a 403 with
``x-ratelimit-remaining: 0``, waits for ``retry-after`` or ``x-ratelimit-reset`` (``wire.py``).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from requests.utils import parse_header_links

from fenceline_client.provider_tags import github_marker
from ledger.models import Operation
from ledger.services.reconciliation.protocol import Lookup, Verdict
from ledger.services.reconciliation.providers import cannot_tell, json_of, required_credential, seen, settings_of, since
from ledger.services.reconciliation.wire import WIRE_DEFAULTS, Answer, Wire, retry_after

DEFAULTS: dict[str, Any] = {
    "base_url": "https://api.github.com",
    "auth": None,
    "comments": "issue",
    "max_pages": 50,
    "since_margin_s": 300,
    **WIRE_DEFAULTS,
}
RESOURCE = re.compile(
    r"^(?:https://github\.com/)?(?P<owner>[A-Za-z0-9_.-]+)/(?P<repo>[A-Za-z0-9_.-]+)(?:#|/issues/|/pulls?/)(?P<number>[0-9]+)$"
)
HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}


def throttled(answer: Answer) -> tuple[bool, float | None]:
    """GitHub's primary and secondary rate limits (its REST docs, "Rate limits")."""
    if answer.status not in (403, 429):
        return False, None
    wait = retry_after(answer.headers)
    if wait is not None:
        return True, wait
    if answer.headers.get("x-ratelimit-remaining") == "0":
        reset = answer.headers.get("x-ratelimit-reset", "")
        return True, max(0.0, float(reset) - time.time()) if reset.isdigit() else None
    return answer.status == 429, None


class GitHubReconciler:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.config = settings_of(name, config, DEFAULTS)
        if self.config["comments"] not in ("issue", "review"):
            raise ImproperlyConfigured(f'reconciler {name!r}: comments must be "issue" or "review"')
        credential = required_credential(name, self.config)
        self.wire = Wire(
            name,
            self.config["base_url"],
            credential=credential,
            options=self.config,
            headers=HEADERS,
            throttled=throttled,
        )

    def lookup(self, operation: Operation, *, request_id: str = "", now: datetime | None = None) -> Lookup:
        where = RESOURCE.match(operation.resource)
        if where is None:
            why = "the operation's resource names no issue or pull request (owner/repo#number)"
            return Lookup(Verdict.CANNOT_TELL, asked="", why=why)
        kind = "issues" if self.config["comments"] == "issue" else "pulls"
        path = f"/repos/{where['owner']}/{where['repo']}/{kind}/{where['number']}/comments"
        after = since(operation, self.config["since_margin_s"]).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        marker = github_marker(operation.idempotency_key)
        answer = self.wire.get(path, {"per_page": 100, "since": after})
        first, found, pages = answer, [], 1
        while True:
            comments = json_of(answer)
            if answer.status != 200 or not isinstance(comments, list):
                return cannot_tell(answer, f"GitHub answered status {answer.status} for {where.group(0)}")
            found += [c for c in comments if isinstance(c, dict) and marker in str(c.get("body") or "")]
            following = _next(answer)
            if not following:
                break
            if pages >= self.config["max_pages"]:
                return cannot_tell(first, f"more than {self.config['max_pages']} pages of comments")
            answer, pages = self.wire.get(following), pages + 1
        return _verdict(found, first, pages)


def _verdict(found: list[dict[str, Any]], answer: Answer, pages: int) -> Lookup:
    ids = [str(c.get("id", ""))[:40] for c in found]
    read: dict[str, Any] = {"comment_ids": ids, "pages": pages}
    if len(found) > 1:
        return cannot_tell(answer, f"{len(found)} comments carry the marker", **read)
    if found:
        return Lookup(
            Verdict.HAPPENED,
            why=f"comment {ids[0]} carries the marker",
            provider_request_id=ids[0],
            read=read,
            **seen(answer),
        )
    return Lookup(Verdict.DID_NOT_HAPPEN, why="no comment carries the marker", read=read, **seen(answer))


def _next(answer: Answer) -> str:
    for link in parse_header_links(answer.headers.get("Link", "")):
        if link.get("rel") == "next" and link.get("url"):
            return str(link["url"])
    return ""
