"""GitHub's REST API for comments (docs.github.com/rest/issues/comments, /rest/pulls/comments):

GET /repos/{owner}/{repo}/issues/{n}/comments?per_page=N&page=P&since=ISO8601
GET /repos/{owner}/{repo}/pulls/{n}/comments?per_page=N&page=P&since=ISO8601
200 [{"id": 1, "node_id": ..., "html_url": ..., "body": ..., "user": {...},
      "created_at": ..., "updated_at": ...}], Link: <...page=2>; rel="next", <...>; rel="last"
404 {"message": "Not Found", "documentation_url": ...}
401 {"message": "Bad credentials", ...}
403 / 429 rate limited: x-ratelimit-remaining: 0 and x-ratelimit-reset, or retry-after"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from tests.fakes.base import FakeProvider, Reply


class FakeGitHub(FakeProvider):
    def __init__(self, *, credential: str) -> None:
        super().__init__(credential=credential)
        self.comments: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}

    def comment(self, issue: str, body: str, *, kind: str = "issues", at: str = "") -> dict[str, Any]:
        at = at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        owner_repo, number = issue.split("#")
        owner, repo = owner_repo.split("/")
        thread = self.comments.setdefault((owner, repo, kind, int(number)), [])
        made = {
            "id": 1_000_000 + sum(len(c) for c in self.comments.values()),
            "node_id": "IC_fake",
            "html_url": f"https://github.com/{owner}/{repo}/issues/{number}#issuecomment-1",
            "body": body,
            "user": {"login": "fenceline-bot", "id": 1},
            "created_at": at,
            "updated_at": at,
        }
        thread.append(made)
        return made

    def unauthorized(self) -> Reply:
        return Reply(401, {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"})

    def route(self, path: str, query: dict[str, list[str]]) -> Reply:
        parts = path.strip("/").split("/")
        if len(parts) != 6 or parts[0] != "repos" or parts[3] not in ("issues", "pulls") or parts[5] != "comments":
            return Reply(404, {"message": "Not Found"})
        key = (parts[1], parts[2], parts[3], int(parts[4]))
        if key not in self.comments:
            return Reply(404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"})
        since = query.get("since", [""])[0]
        comments = [c for c in self.comments[key] if not since or c["updated_at"] >= since]
        per_page = min(int(query.get("per_page", ["30"])[0]), 100)
        page = int(query.get("page", ["1"])[0])
        data, following = self.pages(comments, per_page, (page - 1) * per_page)
        headers = {}
        if following is not None:
            rest = {"per_page": per_page, **({"since": since} if since else {})}
            headers["Link"] = f'<{self.url}{path}?{urlencode({**rest, "page": page + 1})}>; rel="next"'
        return Reply(200, data, headers)
