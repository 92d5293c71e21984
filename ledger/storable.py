"""What PostgreSQL stores byte for byte, and what it does not.

Every JSON value a caller sends passes :func:`storage_problem` at the API boundary (the body
parser, ``ledger/api/body.py``), and every event's fields pass it again before they are hashed
(``ledger/services/evidence/append.py``). A value is refused, never altered, when storage would
fail or change it:

* **NUL characters** in any string or key: PostgreSQL ``text`` and ``jsonb`` cannot hold them
  (a write fails).
* **Lone surrogates** (``"\\ud800"``): not encodable as UTF-8 (a write fails).
* **Non-finite numbers**: JSON has no ``NaN`` or ``Infinity`` (the parser refuses them first).
* **Negative zero**: ``jsonb`` stores ``-0.0`` as ``0.0``.
* **Floats of magnitude 1e16 or more**: Python writes them with an exponent (``1e+16``),
  ``jsonb`` keeps them as ``numeric`` and reads them back as the integer ``10000000000000000``.

The last two would be accepted and then read back as a different document, whose canonical
bytes no longer hash to the hash recorded when it was appended: the verifier would report a
tampering that never happened. Every other float round-trips: ``numeric`` keeps the exact
decimal Python wrote (``repr``), and reading it back gives the same float and the same repr.
``tests/faults/test_chain_storage_roundtrip.py`` holds that with a property over arbitrary JSON.

Standard library only.
"""

import math
from collections.abc import Callable

# |x| at or above this is written in exponent form by repr() and read back from numeric as an int.
FLOAT_EXPONENT_FORM = 1e16


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text cannot hold a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text holds a lone surrogate (not valid UTF-8)"
    return None


def _number_problem(number: float) -> str | None:
    if not math.isfinite(number):
        return "numbers must be finite"
    if number == 0.0 and math.copysign(1.0, number) < 0:
        return "-0.0 is stored as 0.0; send 0"
    if abs(number) >= FLOAT_EXPONENT_FORM:
        return "a float of magnitude 1e16 or more is stored as an integer; send an integer or a string"
    return None


def storage_problem(value: object, *, root: str = "", segment: Callable[[str], str] = str) -> tuple[str, str] | None:
    """The first (path, problem) in ``value`` that storage would refuse or change, or None.

    Paths join keys and list indexes with dots (``fields.a.3``), starting at ``root``; a key is
    shown through ``segment`` (the API passes one that never echoes a credential-like key)."""
    stack: list[tuple[str, object]] = [(root, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            problem = _text_problem(item)
        elif isinstance(item, float):
            problem = _number_problem(item)
        elif isinstance(item, dict):
            problem = None
            children = []
            for key, child in item.items():
                child_path = f"{path}.{segment(str(key))}" if path else segment(str(key))
                key_problem = _text_problem(str(key))
                if key_problem is not None:
                    return child_path, f"key: {key_problem}"
                children.append((child_path, child))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            problem = None
            stack.extend(reversed([(f"{path}.{i}" if path else str(i), child) for i, child in enumerate(item)]))
        else:
            problem = None
        if problem is not None:
            return path or "body", problem
    return None
