"""How the console shows stored values."""

import json

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.filter
def pretty_json(value: object) -> str:
    """A stored JSON value indented for reading (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


@register.filter
def code_breaks(value: object) -> SafeString:
    """A code such as WORKER_REPORTED_UNKNOWN that may wrap after each underscore (``<wbr>``),
    escaped: a narrow column breaks it between its words, never inside one."""
    return mark_safe("_<wbr>".join(escape(part) for part in str(value).split("_")))  # noqa: S308  # each part escaped
