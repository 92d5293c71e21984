"""The verifier reads the next batch while it checks the current one
(``verification._fetched_ahead``): every batch arrives once and in order, the cursor is
used by one thread at a time, and closing early waits for the fetch in flight (the cursor
closes right after)."""

import threading
import time

import pytest

from ledger.sql.evidence import _fetched_ahead


class Source:
    def __init__(self, batches: list[list[int]], delay: float = 0.0) -> None:
        self.batches = list(batches)
        self.delay = delay
        self.calls = 0
        self.in_flight = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def fetch(self) -> list[int]:
        with self.lock:
            self.calls += 1
            self.in_flight += 1
            self.most_at_once = max(self.most_at_once, self.in_flight)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1
        return self.batches.pop(0) if self.batches else []


def test_every_batch_once_in_order_one_fetch_at_a_time():
    source = Source([[1, 2], [3], [4, 5, 6]], delay=0.01)
    assert list(_fetched_ahead(source.fetch)) == [[1, 2], [3], [4, 5, 6]]
    assert source.calls == 4  # the last, empty one ends it
    assert source.most_at_once == 1


def test_the_next_batch_is_fetched_while_the_caller_works():
    source = Source([[1], [2], [3]], delay=0.05)
    batches = _fetched_ahead(source.fetch)
    assert next(batches) == [1]
    deadline = time.monotonic() + 5
    while source.calls < 2:  # asked for before the caller asks
        assert time.monotonic() < deadline
        time.sleep(0.005)
    batches.close()


def test_closing_early_waits_for_the_fetch_in_flight():
    source = Source([[1], [2], [3]], delay=0.2)
    batches = _fetched_ahead(source.fetch)
    assert next(batches) == [1]
    batches.close()
    assert source.in_flight == 0  # the cursor may close now
    assert source.calls == 2


def test_a_failed_fetch_reaches_the_caller():
    def fetch() -> list[int]:
        raise OSError("connection lost")

    with pytest.raises(OSError, match="connection lost"):
        list(_fetched_ahead(fetch))
