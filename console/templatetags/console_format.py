"""How the console shows stored values."""

import json

from django import template

register = template.Library()


@register.filter
def pretty_json(value: object) -> str:
    """A stored JSON value indented for reading (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
