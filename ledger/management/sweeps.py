"""What the sweep commands share: ``--processes``, copies of the sweep at once for a backlog."""

from argparse import ArgumentParser
from collections.abc import Callable

from django.core.management.base import CommandError

from ledger.services.operating.processes import SweepFailed, in_processes


def add_processes_argument(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="copies of the sweep at once, each in its own process, splitting the batches between them"
        " (for a backlog; about one per core of the database's machine; default 1)",
    )


def run_sweep[R](sweep: Callable[[int], R], processes: int) -> list[R]:
    """``sweep(index)`` in ``processes`` processes (:func:`in_processes`), with a failure as a
    command error."""
    if processes < 1:
        raise CommandError("--processes must be at least 1")
    try:
        return in_processes(sweep, processes)
    except SweepFailed as exc:
        raise CommandError(f"the sweep failed in {exc}; what the other batches committed stays") from exc


def prefix(index: int, processes: int) -> str:
    """How a copy's progress lines start: with its number when there are several."""
    return f"[{index}] " if processes > 1 else ""
