"""Time-ordered ids: UUID version 7 (RFC 9562), which Python's ``uuid`` module has only from 3.14.

An event id made by ``uuid.uuid4`` lands anywhere in the unique index on ``ledger_event.event_id``:
once that index outgrows memory, every append reads and dirties a page of its own (and, after each
checkpoint, writes that page whole to the WAL). A version 7 id starts with the time, so the ids
appended now sit together at the index's right-hand end, in the pages already in memory.
"""

import os
import re
import threading
import time
import uuid

from ledger.errors import InvalidInput

_SUB_MS = 1 << 12  # rand_a: 12 bits, a 4096th of a millisecond (RFC 9562, 6.2 method 3)
_RAND_B = (1 << 62) - 1

_lock = threading.Lock()
_last = 0  # the newest (milliseconds << 12 | fraction) handed out by this process

# A bulk revocation by lease-id prefix needs this many hex digits, to avoid revoking by accident.
MIN_PREFIX_HEX_DIGITS = 4
UUID_TEXT_DASHES = frozenset({8, 13, 18, 23})


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48 bits of Unix time in milliseconds, the version (7), 12 bits of the time
    within that millisecond, the RFC 9562 variant and 62 random bits.

    Within a process the ids increase strictly: when the clock has not moved past the last id
    (two ids in one 4096th of a millisecond) or has stepped back, the time part of the last one
    is advanced by one. Across processes they are ordered by their time to that precision and
    told apart by the random bits."""
    global _last
    nanos = time.time_ns()
    stamp = (nanos // 1_000_000) * _SUB_MS + (nanos % 1_000_000) * _SUB_MS // 1_000_000
    with _lock:
        if stamp <= _last:
            stamp = _last + 1
        _last = stamp
    rand_b = int.from_bytes(os.urandom(8)) & _RAND_B
    return uuid.UUID(int=(stamp >> 12) << 80 | 0x7 << 76 | (stamp & 0xFFF) << 64 | 0b10 << 62 | rand_b)


def uuid7_time_ms(value: uuid.UUID) -> int:
    """The Unix time in milliseconds that a UUIDv7 carries."""
    return value.int >> 80


def lease_id_prefix_range(prefix: object) -> tuple[uuid.UUID, uuid.UUID]:
    """The lease ids starting with ``prefix`` (text form, dashes optional) as a range of
    UUIDs, so the primary key index finds them."""
    if not isinstance(prefix, str):
        raise InvalidInput("prefix must be hex digits of a lease id")
    text = prefix.strip().lower()
    if "-" in text:
        if len(text) > 36 or any((ch == "-") != (i in UUID_TEXT_DASHES) for i, ch in enumerate(text)):
            raise InvalidInput("prefix must be the start of a lease id (dashes only where a lease id has them)")
        text = text.replace("-", "")
    if not re.fullmatch(r"[0-9a-f]*", text) or len(text) > 32:
        raise InvalidInput("prefix must be hex digits of a lease id")
    if len(text) < MIN_PREFIX_HEX_DIGITS:
        raise InvalidInput(
            f"prefix must have at least {MIN_PREFIX_HEX_DIGITS} hex digits, to avoid revoking by accident"
        )
    return uuid.UUID(text.ljust(32, "0")), uuid.UUID(text.ljust(32, "f"))
