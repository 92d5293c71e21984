"""The dashboard's trends in a real browser: with a day of history in two tenants, the four
charts are drawn (inline SVG, each with a text alternative), their numbers open as a
table, and the page reads at desktop and phone widths (screenshots in
test-artifacts/browser/dashboard-trends*.png)."""

from datetime import timedelta

from playwright.sync_api import expect

from ledger.services.evidence.verification import run_verify
from ledger.services.fence import leases, runs
from ledger.services.tenancy.roles import role_grant
from tests.browser.accounts import sign_in
from tests.browser.conftest import ARTIFACTS
from tests.console.trend_history import clock, refusals, spend, this_hour, unknown_history
from tests.factories import leased_run, set_cost_policy, unknown_cases


def history(acme, globex, sandbox_provider) -> None:
    """A day of UNKNOWN effects and stale-token refusals, spend near the breaker's marks,
    and a verifier that has checked some runs and not others."""
    hour = this_hour()
    unknown_history(acme, hour, sandbox_provider)
    for hours_ago, opened, stale in ((20, 1, 2), (16, 2, 0), (12, 4, 6), (9, 1, 1), (6, 3, 3), (2, 1, 4)):
        with clock(hour - timedelta(hours=hours_ago, minutes=-20)):
            unknown_cases(acme.worker, opened, prefix=f"h{hours_ago}")
            refusals(acme, stale)
            refusals(globex, 1)
    with clock(hour + timedelta(seconds=1)):
        refusals(acme, 2)
    set_cost_policy(acme.tenant, tenant_limit=100_000)
    spend(acme, "summary-1", 30_000, actual=25_000)
    spend(acme, "summary-2", 40_000)
    set_cost_policy(globex.tenant, tenant_limit=5_000)
    spend(globex, "globex-1", 4_300)
    done, token = leased_run(acme.worker)
    runs.run_complete(worker=acme.worker, run_id=done.pk, fencing_token=token)
    run_verify(run_id=done.pk)
    waiting, token = leased_run(globex.worker)
    leases.lease_renew(worker=globex.worker, run_id=waiting.pk, owner_id="owner-a", fencing_token=token, ttl_s=30)


def test_the_trends_are_drawn_with_their_numbers(live_server, page, screenshot, acme, outsider, sandbox, viewer):
    history(acme, outsider, sandbox)
    role_grant(username=viewer.username, tenant=outsider.tenant, role="viewer")  # vera reads both tenants

    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, live_server, viewer)
    expect(page.get_by_role("heading", name="Trends")).to_be_visible()

    trends = page.locator("#trends")
    expect(trends.locator("figure.trend")).to_have_count(4)
    unknown = trends.get_by_role("img", name="UNKNOWN effects opened and settled, per hour")
    expect(unknown).to_be_visible()
    expect(unknown).to_have_attribute(
        "aria-label",
        "UNKNOWN effects opened and settled, per hour over the last 24 hours: 15 opened, 1 settled by people, 1 settled by reconcilers in all; at most 4 in one hour. The table below lists every hour.",
    )
    expect(trends.get_by_role("img", name="Stale-token rejections, per hour")).to_be_visible()
    expect(trends.get_by_role("img", name="acme: 65,000 of 100,000 cents used (65%)")).to_be_visible()
    expect(trends.get_by_role("img", name="globex: 4,300 of 5,000 cents used (86%)")).to_be_visible()
    expect(trends.locator(".lag")).to_have_count(2)
    expect(trends.locator(".lag").first).to_contain_text("acme")
    screenshot("dashboard-trends")

    # The minute's poll asks for the trends partial alone (HX-Target: trends) and swaps it in.
    refusals(acme, 1)
    page.evaluate("htmx.ajax('GET', '/', {target: '#trends', swap: 'outerHTML'})")
    expect(trends.locator(".trend-legend").nth(1)).to_contain_text("stale-token rejections: 25")
    expect(page.locator("#trends")).to_have_count(1)
    expect(page.locator("#counts")).to_have_count(1)

    stale = trends.locator("figure", has=page.get_by_role("heading", name="Stale-token rejections"))
    stale.get_by_text("The numbers per hour").click()
    table = stale.get_by_role("table")
    expect(table).to_be_visible()
    expect(table.get_by_role("row")).to_have_count(25)
    trends.screenshot(path=str(ARTIFACTS / "dashboard-trends-numbers.png"))

    page.set_viewport_size({"width": 390, "height": 900})
    expect(trends.locator("figure.trend").first).to_be_visible()
    trends.screenshot(path=str(ARTIFACTS / "dashboard-trends-narrow.png"))
