"""The run page of an MCP session in a real browser (issue 37): the demo's gateway session,
its panel and each call's args digest, on a laptop and at a phone's width."""

import pytest
from playwright.sync_api import expect

from console.demo import gateway
from console.demo.acting import Acting
from ledger.models import Run
from tests.browser.accounts import sign_in
from tests.browser.conftest import ARTIFACTS


@pytest.mark.parametrize("width", [1400, 390])
def test_the_mcp_session_panel_and_the_args_digests_fit_the_screen(live_server, page, screenshot, acme, viewer, width):
    gateway.seed(Acting(acme.worker), lambda line: None)
    run = Run.objects.get(tenant=acme.tenant, external_id=f"mcp:claude-desktop:{gateway.SESSION}")
    sign_in(page, live_server, viewer)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    panel = page.locator("#mcp-session")
    expect(panel).to_contain_text("claude-desktop")
    expect(panel).to_contain_text("2025-06-18")
    expect(panel).to_contain_text("git_commit \u00d7 2")
    expect(panel).to_contain_text("1 (github_token)")
    expect(page.locator("#run-operations .args-digest")).to_have_count(5)
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at {width}px"
    panel.scroll_into_view_if_needed()
    screenshot(f"run-mcp-session-{width}px")
    # The two parts this page adds, at their own size (the full page is long).
    panel.screenshot(path=str(ARTIFACTS / f"run-mcp-session-panel-{width}px.png"))
    page.locator("#run-operations").screenshot(path=str(ARTIFACTS / f"run-mcp-session-operations-{width}px.png"))
