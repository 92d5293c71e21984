"""``in_processes``: one sweep in several forked processes, each one's result or failure
brought back (ledger/services/operating/processes.py). The sweeps themselves are run this
way against PostgreSQL in tests/faults/test_lease_reaper_jobs.py."""

import os

import pytest

from ledger.services.operating.processes import SweepFailed, in_processes

# pytest-xdist's worker keeps a thread for its channel, so Python warns that a fork may copy
# a lock that thread holds. The children here run only the lambdas below; the commands fork
# from a process with one thread (tests/faults/test_lease_reaper_jobs.py runs one).
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


def test_each_process_answers_in_order_from_its_own_process():
    answers = in_processes(lambda index: (index, os.getpid()), 3)
    assert [index for index, _ in answers] == [0, 1, 2]
    pids = {pid for _, pid in answers}
    assert len(pids) == 3 and os.getpid() not in pids


def test_one_process_runs_the_sweep_here():
    assert in_processes(lambda index: (index, os.getpid()), 1) == [(0, os.getpid())]


def test_a_failing_copy_is_named_with_its_exception_type_only_after_the_others_finish(tmp_path):
    canary = "sk_live_CANARY_in_an_exception_text"

    def sweep(index: int) -> int:
        if index == 1:
            raise ValueError(canary)
        (tmp_path / f"done-{index}").touch()
        return index

    with pytest.raises(SweepFailed) as failed:
        in_processes(sweep, 3)
    assert str(failed.value) == "process 1: ValueError"
    assert canary not in str(failed.value)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["done-0", "done-2"]


def test_a_copy_that_dies_without_answering_is_reported_not_waited_for():
    def sweep(index: int) -> int:
        if index == 0:
            os._exit(3)
        return index

    with pytest.raises(SweepFailed, match=r"^process 0: exited with code 3 before it answered$"):
        in_processes(sweep, 2)


def test_at_least_one_process():
    with pytest.raises(ValueError, match="at least 1"):
        in_processes(lambda index: index, 0)
