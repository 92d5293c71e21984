"""Request field bounds read from the columns the values are stored in.

A string field is as long as its ``CharField`` allows; an integer field stays inside its
column's range (``PositiveIntegerField`` 0..2^31-1, ``BigIntegerField`` +-2^63), and every
integer also inside I-JSON's exactly representable range (+-2^53-1), so that every client's
JSON parser reads back the number it sent. A value outside its bounds is a 422 naming the
field at the boundary instead of a database error.

Integer fields take integral JSON numbers written as floats (``30.0``): JSON Schema's
``integer`` includes them, so the published schema and the server agree.
"""

from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations
from pydantic import BeforeValidator, Field

JSON_SAFE_INTEGER = 2**53 - 1


def _integral_float(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Last in an integer field's Annotated, after its bounds (so the schema keeps minimum and
# maximum): also take an integral float; never a bool, a string or 1.5.
# ``Annotated[StrictInt, bounds(Operation, "payload_bytes", ge=0), WHOLE]``
WHOLE = BeforeValidator(_integral_float)


# Quoted: Field is generic in django-stubs only, not at run time.
def _field(model: type[models.Model], name: str) -> "models.Field[Any, Any]":
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)  # noqa: S101 - a programming error, at import time
    return field


def integer_range(model: type[models.Model], name: str) -> tuple[int, int]:
    """The range the column holds, narrowed to JSON-safe integers."""
    internal = _field(model, name).get_internal_type()
    low, high = BaseDatabaseOperations.integer_field_ranges[internal]
    return max(low, -JSON_SAFE_INTEGER), min(high, JSON_SAFE_INTEGER)


def bounds(model: type[models.Model], name: str, *, ge: int | None = None, le: int | None = None) -> Any:
    """``Field(ge=..., le=...)``: the range of the column ``model.name``, narrowed by ``ge``/``le``."""
    low, high = integer_range(model, name)
    return Field(ge=low if ge is None else max(low, ge), le=high if le is None else min(high, le))


def length(model: type[models.Model], name: str) -> int:
    """The ``max_length`` of the column ``model.name``."""
    max_length = _field(model, name).max_length
    assert max_length is not None  # noqa: S101 - only CharFields are bounded this way
    return max_length
