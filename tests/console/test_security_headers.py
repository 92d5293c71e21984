"""Every page the console serves carries its Content-Security-Policy (and the headers Django's
security middleware adds), whatever its answer; no template holds an inline script, an inline
event handler, a ``javascript:`` URL or an inline style, which that policy would block
(tests/browser/test_content_security_policy.py loads the pages in a browser)."""

import re
import uuid
from pathlib import Path

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.helpers import Browser

ROOT = Path(__file__).resolve().parents[2]
ARGS = {
    "uuid": lambda: str(uuid.uuid4()),
    "int": lambda: "1",
    "slug": lambda: "acme",
    "str": lambda: "x",
    "path": lambda: "x",
}
_CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")


def console_paths() -> list[str]:
    """A concrete path for every console URL pattern (not the API's nor the admin's)."""
    paths: list[str] = []
    for entry in get_resolver().url_patterns:
        route = str(entry.pattern)
        if route.startswith(("api/", "admin/", "accounts/")) and route != "accounts/login/":
            continue
        if isinstance(entry, URLResolver) or not isinstance(entry, URLPattern):
            continue
        paths.append("/" + _CONVERTER.sub(lambda m: ARGS[m.group(1) or "str"](), route))
    return paths


def test_every_console_url_answers_with_the_policy(acme, admin):
    browser = Browser(admin)
    paths = console_paths()
    assert len(paths) > 40 and "/workers/" in paths and "/accounts/login/" in paths
    for path in paths:
        answer = browser.get(path)
        assert answer.status_code != 500, path  # /readyz may say 503 here
        policy = answer.headers.get("Content-Security-Policy", "")
        assert "default-src 'none'" in policy and "script-src 'self'" in policy, path
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, path
        assert "frame-ancestors 'none'" in policy and "form-action 'self'" in policy, path
        assert answer.headers["X-Content-Type-Options"] == "nosniff", path
        assert answer.headers["X-Frame-Options"] == "DENY", path
        assert answer.headers["Referrer-Policy"] == "same-origin", path


@pytest.mark.parametrize("path", ["/accounts/login/", "/api/v1/docs", "/healthz", "/no-such-page/"])
def test_pages_outside_the_signed_in_console_carry_it_too(client, path):
    assert "script-src 'self'" in client.get(path).headers["Content-Security-Policy"]


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "an inline <script>"),
    (re.compile(r"<[^>]*\son[a-z]+\s*=", re.I), "an inline event handler"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
    (re.compile(r"<[^>]*\sstyle\s*=|<style", re.I), "an inline style"),
]
HTMX_ATTRIBUTE = re.compile(r"""\b(hx-[a-z:-]+)=["']([^"']*)""")


def htmx_eval(name: str, value: str) -> bool:
    """htmx evaluates this attribute as script (hx-on, hx-vars, js: values, trigger filters)."""
    return (
        name.startswith("hx-on")
        or name == "hx-vars"
        or value.strip().startswith(("js:", "javascript:"))
        or (name == "hx-trigger" and "[" in value)
    )


@pytest.mark.parametrize("template", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "templates").rglob("*.html")))
def test_no_template_needs_inline_script_style_or_eval(template):
    text = (ROOT / template).read_text()
    for pattern, what in INLINE:
        found = pattern.search(text)
        assert found is None, f"{template}: {what}: {found.group(0) if found else ''}"
    evaluated = [m.group(0) for m in HTMX_ATTRIBUTE.finditer(text) if htmx_eval(m.group(1), m.group(2))]
    assert evaluated == [], f"{template}: htmx would eval {evaluated}"
