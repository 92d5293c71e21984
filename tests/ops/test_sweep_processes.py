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


@pytest.mark.django_db
def test_refused_inside_a_transaction_whose_connection_it_would_close():
    from django.db import connection

    connection.ensure_connection()  # the test's own transaction is open on it
    with pytest.raises(RuntimeError, match="outside a transaction"):
        in_processes(lambda index: index, 2)


PARENT = """
import os, sys, time
sys.path.insert(0, {root!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
import django
django.setup()
from ledger.services.operating.processes import in_processes

def sweep(index):
    with open(os.path.join({folder!r}, f"copy-{{index}}"), "w") as pid:
        pid.write(str(os.getpid()))
    time.sleep(120)

in_processes(sweep, 2)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper is gone too
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux only: reads /proc")
def test_the_copies_end_when_the_parent_is_killed(tmp_path):
    """A parent killed outright (SIGKILL: no handler runs) leaves no copy sweeping unseen."""
    import signal
    import subprocess
    import sys
    import time

    from django.conf import settings

    code = PARENT.format(root=str(settings.BASE_DIR), folder=str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=settings.BASE_DIR)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("copy-*"))) < 2 or any(not p.read_text() for p in tmp_path.glob("copy-*")):
            assert parent.poll() is None and time.monotonic() < deadline, "the copies did not start"
            time.sleep(0.05)
        copies = [int(path.read_text()) for path in tmp_path.glob("copy-*")]
        assert all(_alive(pid) for pid in copies)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        while any(_alive(pid) for pid in copies):
            assert time.monotonic() < deadline + 30, "a copy outlived its parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
