"""Browser tests: Playwright driving Debian's chromium (never a downloaded browser)."""

import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect

# A loaded two-core CI machine is slower than a laptop: wait longer before calling a page wrong.
expect.set_options(timeout=20_000)

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    }


@pytest.fixture
def screenshot(page):
    """Save a full-page screenshot as a test artifact: screenshot("name")."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture(autouse=True)
def _patient_page(page):
    page.set_default_timeout(30_000)


# pytest-playwright starts Playwright once per session. Its sync API keeps an asyncio loop
# marked as running in the main thread for as long as it lives, so a test outside this folder
# that runs asyncio itself (the MCP gateway's, the agent adapters') and lands in the same xdist
# worker after a browser test would fail with "already running asyncio in this thread". Here
# Playwright and its browser live for one module at a time instead (a chromium start per module).
@pytest.fixture(scope="module")
def playwright():
    from playwright.sync_api import sync_playwright

    started = sync_playwright().start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def browser_type(playwright, browser_name):
    return getattr(playwright, browser_name)


@pytest.fixture(scope="module")
def launch_browser(browser_type_launch_args, browser_type):
    def launch(**kwargs):
        return browser_type.launch(**{**browser_type_launch_args, **kwargs})

    return launch


@pytest.fixture(scope="module")
def browser(launch_browser):
    launched = launch_browser()
    yield launched
    launched.close()


@pytest.fixture(scope="module")
def browser_context_args(playwright, device, base_url):
    args = dict(playwright.devices[device]) if device else {}
    if base_url:
        args["base_url"] = base_url
    return args
