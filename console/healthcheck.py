"""Container healthchecks without curl (the slim image has none), and without Django.

    python -m console.healthcheck http://127.0.0.1:8000/readyz [--timeout 5]
        exit 0 on HTTP 200, 1 on any other status (redirects are not followed), on a
        timeout or on a refused connection.
    python -m console.healthcheck --fresh-file /var/lib/fenceline/beat/celerybeat-schedule --max-age 600
        exit 0 if that file (or a sibling its dbm backend writes, ``PATH.*``) changed within
        the last ``--max-age`` seconds. Celery beat rewrites its schedule at least every
        three minutes while it sends tasks, and the reapers are due every few seconds, so a
        stale file means a beat that stopped ticking.

Nothing secret is printed: only the status code or the exception's type, never the URL's
query, the response body or an exception message (compose.yaml's healthchecks; docs/production.md).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from http.client import HTTPMessage
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

MAX_TIMEOUT_S = 60.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect (to a login page, say) is an answer other than 200, not a hop to follow."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


def check_url(url: str, timeout_s: float) -> tuple[bool, str]:
    """(healthy, what to print) for one GET of ``url``."""
    if urlsplit(url).scheme not in {"http", "https"}:
        return False, "unhealthy: only http and https URLs are checked"
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": "fenceline-healthcheck"})  # noqa: S310
    try:
        with opener.open(request, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = int(exc.code)
        exc.close()
    except (OSError, ValueError) as exc:
        return False, f"unhealthy: {type(exc).__name__}"
    if status == 200:
        return True, "healthy: HTTP 200"
    return False, f"unhealthy: HTTP {status}"


def check_fresh_file(path: Path, max_age_s: float, now: float | None = None) -> tuple[bool, str]:
    """(healthy, what to print): ``path`` or a ``path.*`` sibling changed within ``max_age_s``."""
    candidates = [path, *path.parent.glob(f"{path.name}.*")] if path.parent.is_dir() else [path]
    mtimes = []
    for candidate in candidates:
        try:
            mtimes.append(candidate.stat().st_mtime)
        except OSError:
            continue
    if not mtimes:
        return False, "unhealthy: the file does not exist"
    age = (time.time() if now is None else now) - max(mtimes)
    if age > max_age_s:
        return False, f"unhealthy: unchanged for {int(age)} s"
    return True, f"healthy: changed {max(int(age), 0)} s ago"


def _bounded_seconds(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be in (0, {MAX_TIMEOUT_S:g}]")
    return value


def _positive_seconds(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m console.healthcheck", description="Container healthchecks without curl."
    )
    parser.add_argument("url", nargs="?", help="GET this URL; healthy on HTTP 200")
    parser.add_argument("--timeout", type=_bounded_seconds, default=5.0, help="seconds (default 5, at most 60)")
    parser.add_argument("--fresh-file", type=Path, help="healthy if this file changed recently")
    parser.add_argument("--max-age", type=_positive_seconds, default=600.0, help="seconds (default 600)")
    args = parser.parse_args(argv)
    if (args.url is None) == (args.fresh_file is None):
        parser.error("give either a URL or --fresh-file")
    if args.url is not None:
        healthy, message = check_url(args.url, args.timeout)
    else:
        healthy, message = check_fresh_file(args.fresh_file, args.max_age)
    print(message)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
