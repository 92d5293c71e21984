import threading
import time
import uuid

from ledger import ids
from ledger.ids import uuid7, uuid7_time_ms


def test_uuid7_has_the_version_variant_and_time_of_rfc_9562():
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    assert isinstance(value, uuid.UUID)
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert before <= uuid7_time_ms(value) <= after
    assert str(value)[14] == "7"  # the version digit, where RFC 9562 puts it
    assert uuid.UUID(str(value)) == value


def test_uuid7_carries_the_time_as_the_rfc_lays_it_out(monkeypatch):
    # 2022-02-22T19:22:22.000000Z, the time of the example in RFC 9562 appendix A.6
    monkeypatch.setattr(ids, "_last", 0)
    monkeypatch.setattr(ids.time, "time_ns", lambda: 0x017F22E279B0 * 1_000_000)
    value = uuid7()
    assert f"{value.int:032x}".startswith("017f22e279b0" + "7000")
    assert uuid7_time_ms(value) == 0x017F22E279B0


def test_ids_made_one_after_another_increase_strictly_as_numbers_and_as_text():
    made = [uuid7() for _ in range(5000)]
    assert len(set(made)) == len(made)
    assert made == sorted(made, key=lambda value: value.int)
    assert [str(value) for value in made] == sorted(str(value) for value in made)


def test_ids_still_increase_when_the_clock_stands_still_or_steps_back(monkeypatch):
    now = [time.time_ns()]
    monkeypatch.setattr(ids.time, "time_ns", lambda: now[0])
    standing = [uuid7() for _ in range(10_000)]  # more than 4096 in one millisecond
    now[0] -= 5_000_000_000  # five seconds back
    after_step = [uuid7() for _ in range(10)]
    made = standing + after_step
    assert made == sorted(made, key=lambda value: value.int)
    assert len(set(made)) == len(made)
    assert all(value.version == 7 and value.variant == uuid.RFC_4122 for value in made)


def test_the_random_bits_differ_between_ids_of_one_instant(monkeypatch):
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    tails = {uuid7().int & ((1 << 62) - 1) for _ in range(200)}
    assert len(tails) == 200


def test_threads_never_get_the_same_id():
    made: list[uuid.UUID] = []

    def make() -> None:
        made.extend(uuid7() for _ in range(2000))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(made)) == len(made) == 8000
