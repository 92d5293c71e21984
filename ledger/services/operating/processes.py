"""One sweep in several processes at once, for a backlog.

Every sweep claims its batches with ``FOR UPDATE SKIP LOCKED``, so copies of it running at
once split the work instead of doing it twice. A sweep's Python (building each batch's
events) and PostgreSQL's work on the batch before it then run on different cores, where one
process spends about half its time waiting for the other side (docs/performance.md,
"Sweeps in parallel").

The copies are forked from this process: they start at once with everything already
loaded, and nothing has to be pickled on the way in. Only the results come back, one per
process through its own pipe. Fork is only safe in a process with one thread, such as a
management command; a Celery prefork child may not start processes of its own, so the
periodic jobs run one copy each.
"""

import ctypes
import gc
import multiprocessing
import os
import signal
from collections.abc import Callable
from contextlib import suppress
from multiprocessing.connection import Connection
from typing import cast

from django.db import connections


class SweepFailed(RuntimeError):
    """A copy of the sweep raised or died. The others ran to their end, and every batch
    any of them committed stays committed."""


def in_processes[R](sweep: Callable[[int], R], processes: int) -> list[R]:
    """``sweep(0)`` … ``sweep(processes - 1)`` at once, each in a process forked from this
    one, and their results in that order. With one process, ``sweep(0)`` runs here.

    The database connections are closed before the fork, so that no child shares the
    parent's socket, and each child opens its own. The objects loaded so far are moved out
    of the garbage collector's sight first (``gc.freeze``): the children's collections then
    skip the modules, models and settings they inherited, and those pages stay shared."""
    if processes < 1:
        raise ValueError("processes must be at least 1")
    if processes == 1:
        return [sweep(0)]
    if any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        raise RuntimeError("in_processes closes the connections: call it outside a transaction")
    connections.close_all()
    gc.freeze()
    context = multiprocessing.get_context("fork")
    started = []
    try:
        for index in range(processes):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_child, args=(sweep, index, send, os.getpid()), name=f"sweep-{index}")
            child.start()
            send.close()  # the child's end: once it exits, a read here ends instead of waiting
            started.append((child, receive))
        outcomes = [_outcome(child, receive) for child, receive in started]
    except BaseException:
        # Interrupted (Ctrl-C, an error here): stop the copies rather than leave them sweeping
        # on their own. Each batch is one transaction, so a stopped copy loses nothing.
        for child, _ in started:
            child.terminate()
        raise
    finally:
        for child, receive in started:
            child.join()
            receive.close()
        gc.unfreeze()
    failed = [f"process {index}: {error}" for index, (ok, error) in enumerate(outcomes) if not ok]
    if failed:
        raise SweepFailed("; ".join(failed))
    return [cast(R, value) for _, value in outcomes]


def _child[R](sweep: Callable[[int], R], index: int, send: Connection, parent: int) -> None:
    _end_with_parent(parent)
    try:
        outcome: tuple[bool, object] = (True, sweep(index))
    except Exception as exc:
        # The exception's type only: its text may quote a statement's values.
        outcome = (False, type(exc).__name__)
    finally:
        with suppress(Exception):  # a connection that is already gone
            connections.close_all()
    send.send(outcome)
    send.close()


def _end_with_parent(parent: int) -> None:
    """On Linux, have the kernel send this copy SIGTERM when the parent dies (SIGKILL
    included), so that no copy goes on sweeping unseen; elsewhere this does nothing."""
    with suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request above
        os._exit(1)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _outcome(child: multiprocessing.process.BaseProcess, receive: Connection) -> tuple[bool, object]:
    try:
        outcome: tuple[bool, object] = receive.recv()  # what _child sent
    except EOFError:  # it died before answering (killed, out of memory)
        child.join()
        return False, f"exited with code {child.exitcode} before it answered"
    return outcome
