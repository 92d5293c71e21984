"""The console under its Content-Security-Policy in a real browser: every main page loads,
its htmx and keyboard script run, and the browser reports no violation (no inline script,
style or eval anywhere, htmx included); the live regions' pause (data-poll-pause-*, which
replaced htmx's eval'd trigger conditions) still holds."""

from playwright.sync_api import expect

from tests.browser.accounts import sign_in
from tests.factories import leased_run, pending_approvals, stuck_resource, unknown_cases

# Runs in the page before its own scripts (Playwright's init script is not subject to CSP).
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + e.blockedURI + " " + (e.sourceFile || "") + ":" + e.lineNumber);
});
"""


def watch(page) -> list[str]:
    """The CSP complaints the browser prints on the console, collected as they come."""
    complaints: list[str] = []
    page.on(
        "console",
        lambda message: (
            complaints.append(message.text)
            if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text
            else None
        ),
    )
    page.add_init_script(RECORD_VIOLATIONS)
    return complaints


def visit(page, url: str, complaints: list[str]) -> None:
    answer = page.goto(url)
    assert answer is not None and "script-src 'self'" in answer.headers["content-security-policy"], url
    page.wait_for_load_state("networkidle")
    violations = page.evaluate("window.__csp")
    assert violations == [] and complaints == [], (url, violations, complaints)
    if "/api/" not in url:  # a console page: its scripts ran
        assert page.evaluate("document.documentElement.classList.contains('js')"), f"console.js did not run on {url}"
        assert page.evaluate("typeof htmx") == "object", url


def test_every_main_console_page_loads_without_a_csp_violation(live_server, page, acme, admin):
    run, _ = leased_run(acme.worker)
    unknown_cases(acme.worker, 2)
    pending_approvals(acme.worker)
    stuck_resource(acme.worker)
    complaints = watch(page)
    visit(page, live_server.url + "/accounts/login/", complaints)
    sign_in(page, live_server, admin)
    for path in (
        "/",
        "/runs/",
        f"/runs/{run.pk}/",
        "/cases/",
        "/approvals/",
        "/credentials/",
        "/resources/",
        "/workers/",
        f"/workers/{acme.worker.pk}/",
        "/tenants/",
        "/tenants/acme/",
        "/tenants/acme/webhooks/",
        "/upgrades/",
        "/no-such-page/",
    ):
        visit(page, live_server.url + path, complaints)
    # The API's docs (Swagger UI from the ninja package's static files) live under it too.
    visit(page, live_server.url + "/api/v1/docs", complaints)
    expect(page.locator(".swagger-ui")).to_contain_text("/api/v1/runs")

    # htmx at work under the policy: a filter swaps the table, the keyboard help opens.
    page.goto(live_server.url + "/workers/")
    page.locator("select[name=status]").select_option("QUARANTINED")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#workers-table")).to_contain_text("No workers")
    page.keyboard.press("?")
    expect(page.locator("#keys-help")).to_be_visible()
    assert page.evaluate("window.__csp") == [] and complaints == []


def test_a_live_region_pauses_its_poll_while_someone_works_in_it(live_server, page, acme, admin):
    sign_in(page, live_server, admin)
    page.goto(live_server.url + "/workers/")
    confirm = """() => {
      const table = document.getElementById("workers-table");
      const asked = new CustomEvent("htmx:confirm", {detail: {elt: table}, cancelable: true, bubbles: true});
      table.dispatchEvent(asked);
      return asked.defaultPrevented;
    }"""
    assert page.evaluate(confirm) is False  # nobody works in it: the poll goes ahead
    page.locator("#workers-table input[type=checkbox]").first.check()
    assert page.evaluate(confirm) is True  # a ticked row: the poll waits
