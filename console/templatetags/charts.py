"""Small charts drawn on the server as inline SVG (no JavaScript, nothing fetched): columns
per hour, each tenant's cost burn against its breaker thresholds, and the verifier's lag.

Across, coordinates are percentages of the chart's width, so a chart fills its box without
stretching its text; down, they are pixels. A chart is a picture of numbers that are also
printed: each comes with its numbers in a table (in a ``<details>``), its SVG has a text
alternative, and colour is never the only way to tell series apart (the legend and the
table name them)."""

from datetime import datetime, timedelta
from typing import Any

from django import template

from ledger.selectors import span_text

register = template.Library()

# key in the selector's rows -> (what it is called, its CSS class)
SERIES = {
    "opened": ("opened", "series-opened"),
    "by_people": ("settled by people", "series-people"),
    "by_reconciler": ("settled by reconcilers", "series-reconciler"),
    "refused": ("stale-token rejections", "series-stale"),
}
MARK_NAMES = {"throttled_at": "THROTTLED", "degraded_at": "DEGRADED", "open_at": "OPEN"}

# The hourly chart's SVG, in pixels down: the plot between PLOT_TOP and PLOT_BOTTOM, the
# hours underneath.
HEIGHT, PLOT_TOP, PLOT_BOTTOM = 150, 16, 126
TICK_EVERY = 6  # hours between the labels under the columns


def pct(value: float) -> str:
    """A coordinate across, as an SVG percentage."""
    return f"{value:.3f}%"


def px(value: float) -> str:
    return f"{value:.2f}"


def nice_ceiling(value: float) -> int:
    """The smallest of 2, 4, 6, 8, 10, 20, 40, ... at or above ``value``: the top of a
    scale whose middle line is a whole number too."""
    step = 1
    while True:
        for m in (2, 4, 6, 8, 10):
            if step * m >= value:
                return step * m
        step *= 10


@register.inclusion_tag("console/_chart_hourly.html")
def hourly_chart(rows: list[dict[str, Any]], spec: str, chart_id: str, title: str) -> dict[str, Any]:
    """Columns per hour. ``spec`` names the series of ``rows``: groups side by side in each
    hour separated by "|", series stacked within a group by "," ("opened|by_people,by_reconciler")."""
    groups = [group.split(",") for group in spec.split("|")]
    keys = [key for group in groups for key in group]
    peak = max((sum(row[key] for key in group) for row in rows for group in groups), default=0)
    top = nice_ceiling(peak)
    scale = (PLOT_BOTTOM - PLOT_TOP) / top
    slot = 100 / max(len(rows), 1)
    gap = slot * 0.14
    width = (slot - 2 * gap) / len(groups)
    bars = []
    for i, row in enumerate(rows):
        for g, group in enumerate(groups):
            y = float(PLOT_BOTTOM)
            for key in group:
                value = row[key]
                if not value:
                    continue
                height = max(value * scale, 1.5)  # one in a thousand still shows
                y -= height
                bars.append(
                    {
                        "x": pct(i * slot + gap + g * width),
                        "y": px(y),
                        "width": pct(width * (0.86 if len(groups) > 1 else 1)),
                        "height": px(height),
                        "css": SERIES[key][1],
                        "title": f"{hour_label(row['hour'])}: {value} {SERIES[key][0]}",
                    }
                )
    ticks = [{"x": pct(i * slot), "text": f"{row['hour']:%H:%M}"} for i, row in enumerate(rows) if i % TICK_EVERY == 0]
    totals = {key: sum(row[key] for row in rows) for key in keys}
    said = ", ".join(f"{totals[key]} {SERIES[key][0]}" for key in keys)
    return {
        "id": chart_id,
        "title": title,
        "height": HEIGHT,
        "plot_top": PLOT_TOP,
        "plot_bottom": PLOT_BOTTOM,
        "mid": px((PLOT_TOP + PLOT_BOTTOM) / 2),
        "top": top,
        "half": top // 2,
        "bars": bars,
        "ticks": ticks,
        "legend": [{"label": SERIES[key][0], "css": SERIES[key][1], "total": totals[key]} for key in keys],
        "description": f"{title}, per hour over the last 24 hours: {said} in all; "
        f"at most {peak} in one hour. The table below lists every hour.",
        "columns": [SERIES[key][0] for key in keys],
        "rows": [
            {"hour": row["hour"], "label": hour_label(row["hour"]), "values": [row[k] for k in keys]} for row in rows
        ],
    }


def hour_label(hour: datetime) -> str:
    return f"{hour:%H:%M}-{(hour.hour + 1) % 24:02d}:00"


def _meter(burn: dict[str, Any]) -> dict[str, Any]:
    """One tenant's cost burn: its settled and reserved cents as shares of the limit, and
    the breaker's thresholds as marks (thresholds at the same share share one mark)."""
    thresholds = burn["thresholds"]
    shares_text = " / ".join(f"{thresholds[name]:.0%}" for name in MARK_NAMES)
    limit = burn["limit_cents"]
    if limit is None:
        return {"limited": False, "shares_text": shares_text}
    settled = min(burn["settled_cents"] / limit, 1.0) if limit else 0.0
    reserved = min(burn["reserved_cents"] / limit, 1.0 - settled) if limit else 0.0
    marks: dict[float, list[str]] = {}
    for name, label in MARK_NAMES.items():
        marks.setdefault(thresholds[name], []).append(label)
    share = burn["share"]
    return {
        "limited": True,
        "limit_text": f"{limit:,}",
        "used_text": f"{burn['used_cents']:,}",
        "settled_text": f"{burn['settled_cents']:,}",
        "reserved_text": f"{burn['reserved_cents']:,}",
        "share_text": f"{share:.0%}",
        "shares_text": shares_text,
        "thresholds_text": ", ".join(f"{label} at {thresholds[name]:.0%}" for name, label in MARK_NAMES.items()),
        "settled_w": pct(settled * 100),
        "reserved_x": pct(settled * 100),
        "reserved_w": pct(reserved * 100),
        "marks": [
            {
                "x": pct(at * 100),
                "text": f"{at:.0%}",
                "names": " and ".join(names),
                "anchor": "end" if at > 0.94 else ("start" if at < 0.06 else "middle"),
            }
            for at, names in sorted(marks.items())
        ],
    }


@register.inclusion_tag("console/_chart_cost.html")
def cost_chart(burns: list[dict[str, Any]]) -> dict[str, Any]:
    """Each tenant's current TENANT cost window against its breaker thresholds."""
    return {"rows": [{**burn, "meter": _meter(burn)} for burn in burns]}


@register.inclusion_tag("console/_chart_verification.html")
def verification_chart(lags: list[dict[str, Any]], allowance_s: int) -> dict[str, Any]:
    """Per tenant: how long since the newest verified checkpoint, against the largest of
    them but at least the verifier's allowance (marked); and the events of recent runs the
    verifier has not checked yet, against the largest of them."""
    scale = max([allowance_s, *(lag["lag_s"] or 0 for lag in lags)])
    most = max((lag["events_unverified"] for lag in lags), default=0) or 1
    rows = []
    for lag in lags:
        seconds = lag["lag_s"]
        rows.append(
            {
                **lag,
                "lag_text": "never verified" if seconds is None else span_text_ago(seconds),
                "lag_w": None if seconds is None else pct(100 * seconds / scale),
                "events_w": pct(100 * lag["events_unverified"] / most),
            }
        )
    return {
        "rows": rows,
        "allowance_x": pct(100 * allowance_s / scale),
        "allowance_text": span_text(timedelta(seconds=allowance_s)),
    }


def span_text_ago(seconds: int) -> str:
    return "just now" if seconds < 1 else f"{span_text(timedelta(seconds=seconds))} ago"
