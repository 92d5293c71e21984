"""Times as people read them in a queue: relative ("4 min ago", "in 2 h"), with the exact
UTC moment on hover and for machines (``<time datetime>``). ``static/js/console.js`` keeps
the relative text current while a page stays open; without JavaScript the text is as of
the page's rendering, and the exact moment is still in the title."""

from datetime import UTC, datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))


def span(seconds: float) -> str:
    """A duration as its largest whole unit: "45 s", "4 min", "2 h", "3 d"."""
    seconds = abs(seconds)
    for size, unit in _UNITS:
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return "0 s"


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@register.filter
def reltime(moment: datetime | None, now: datetime | None = None) -> SafeString | str:
    """``<time>`` saying how long ago (or how soon) ``moment`` is, exact UTC on hover."""
    if not isinstance(moment, datetime):
        return "—"
    delta = (now or timezone.now()) - moment
    text = (
        "just now"
        if abs(delta) < timedelta(seconds=1)
        else (f"{span(delta.total_seconds())} ago" if delta > timedelta(0) else f"in {span(delta.total_seconds())}")
    )
    return format_html(
        '<time datetime="{}" title="{}" data-rel="ago">{}</time>', moment.isoformat(), _utc(moment), text
    )


@register.filter
def age(moment: datetime | None, now: datetime | None = None) -> SafeString | str:
    """``<time>`` saying how long something has been waiting since ``moment`` ("open 2 h")."""
    if not isinstance(moment, datetime):
        return "—"
    seconds = max(((now or timezone.now()) - moment).total_seconds(), 0)
    return format_html(
        '<time datetime="{}" title="since {}" data-rel="age">{}</time>', moment.isoformat(), _utc(moment), span(seconds)
    )
