"""A pg_auto_failover formation on this machine (``pg_autoctl``): a monitor, a primary and a
secondary, each a PostgreSQL 15 of its own in a temporary directory on free ports, run as the
``postgres`` OS user (pg_autoctl and PostgreSQL refuse to run as root). Installs Debian's
packages when ``pg_autoctl`` is missing.

The monitor is told to notice a dead node within a few seconds (its health checks every
second, a node unhealthy after 3 s) instead of the defaults' 20 s, so a test's failover takes
seconds; docs/production.md "High availability" gives the production values."""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import psycopg

from tests.served import free_port

BIN = "/usr/lib/postgresql/15/bin"
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "3000",
    # the old primary cannot be asked to demote (its keeper is dead too): promote after 3 s, not 30
    "pgautofailover.primary_demote_timeout": "3000",
}


def ensure_installed() -> None:
    if shutil.which("pg_autoctl") and Path(BIN, "postgres").exists():
        return
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "postgresql-15-auto-failover", "pg-auto-failover-cli"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


class Formation:
    def __init__(self, *, synchronous: bool) -> None:
        ensure_installed()
        self.synchronous = synchronous
        self.dir = Path(tempfile.mkdtemp(prefix="fenceline-ha-"))
        shutil.chown(self.dir, "postgres")
        self.monitor_port, self.ports = free_port(), [free_port(), free_port()]
        self.keepers: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ,
            "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
            "XDG_CONFIG_HOME": str(self.dir / "config"),
            "XDG_DATA_HOME": str(self.dir / "data"),
        }

    # --- processes -------------------------------------------------------------------

    def autoctl(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", "pg_autoctl", *args],
            env=self.env, cwd=self.dir, capture_output=True, text=True, errors="replace", check=False,
        )  # fmt: skip
        if check and done.returncode:
            raise RuntimeError(f"pg_autoctl {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    def _keeper(self, name: str, *args: str) -> None:
        log = (self.dir / f"{name}.log").open("wb")
        self.keepers[name] = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", "pg_autoctl", *args],
            env=self.env, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def start(self) -> None:
        monitor = str(self.dir / "monitor")
        self.autoctl("create", "monitor", "--pgdata", monitor, "--pgport", str(self.monitor_port),
                     "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl")  # fmt: skip
        self._keeper("monitor", "run", "--pgdata", monitor)
        self.wait(lambda: self.monitor_sql("SELECT 1"), "the monitor to answer")
        for key, value in MONITOR_SETTINGS.items():
            self.monitor_sql(f"ALTER SYSTEM SET {key} = {value}")
        self.monitor_sql("SELECT pg_reload_conf()")
        for index, port in enumerate(self.ports, start=1):
            name = f"node{index}"
            self._keeper(name, "create", "postgres", "--pgdata", str(self.dir / name), "--pgport", str(port),
                         "--hostname", "127.0.0.1", "--name", name, "--auth", "trust", "--no-ssl",
                         "--monitor", self.monitor_url, "--run")  # fmt: skip
            want = "single" if index == 1 else "secondary"
            self.wait(lambda name=name, want=want: self.state(name) == (want, want), f"{name} to be {want}")
        if not self.synchronous:
            self.autoctl("set", "node", "replication-quorum", "false", "--pgdata", str(self.dir / "node2"))
        self.wait(self._replication_as_asked, "the replication mode")

    def _replication_as_asked(self) -> bool:
        names = self.sql(self.ports[0], "SHOW synchronous_standby_names")[0][0]
        return bool(names) == self.synchronous and self.state("node1") == ("primary", "primary")

    def kill_primary(self) -> float:
        """SIGKILL the primary's postmaster, its keeper (which would otherwise restart it) and
        the postmaster's children (a backend outlives its postmaster until it notices, and may
        still commit): the node is gone, as when its machine is. Returns time.monotonic() of the
        kill. The postmaster is stopped first, so that it forks nothing while its children are
        listed."""
        pid = int((self.dir / "node1" / "postmaster.pid").read_text().split()[0])
        os.killpg(self.keepers["node1"].pid, signal.SIGKILL)
        os.kill(pid, signal.SIGSTOP)
        listed = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        for child in listed.stdout.split():
            with suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        return killed_at

    def cut_replication(self) -> None:
        """The secondary stops streaming from the primary (its WAL receiver is pointed at a
        port nobody answers), as behind a slow or broken link: what the primary commits from
        now on is on the primary alone."""
        port = self.ports[1]
        self.sql(port, f"ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port={free_port()} connect_timeout=1'")
        self.sql(port, "SELECT pg_reload_conf()")
        self.wait(lambda: not self.sql(port, "SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'"),
                  "the secondary to stop streaming")  # fmt: skip

    def stop(self) -> None:
        for keeper in self.keepers.values():
            if keeper.poll() is None:
                keeper.terminate()
        for keeper in self.keepers.values():
            try:
                keeper.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(keeper.pid, signal.SIGKILL)
        for pgdata in ("node1", "node2", "monitor"):
            pidfile = self.dir / pgdata / "postmaster.pid"
            if pidfile.exists():  # a postmaster left behind by a killed keeper
                subprocess.run(["runuser", "-u", "postgres", "--", f"{BIN}/pg_ctl", "-D", str(self.dir / pgdata),
                                "stop", "-m", "immediate"], capture_output=True, check=False)  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- what it says ------------------------------------------------------------------

    @property
    def monitor_url(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"

    def url(self, dbname: str) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout=2"

    def monitor_sql(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        return self.sql(self.monitor_port, sql, params, dbname="pg_auto_failover")

    @staticmethod
    def sql(
        port: int, sql: str, params: tuple[object, ...] = (), *, dbname: str = "postgres", user: str = "postgres"
    ) -> list[tuple[object, ...]]:
        with psycopg.connect(host="127.0.0.1", port=port, dbname=dbname, user=user, autocommit=True,
                             connect_timeout=2) as conn, conn.cursor() as cursor:  # fmt: skip
            cursor.execute(sql, params or None)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    def state(self, name: str) -> tuple[str, str] | None:
        rows = self.monitor_sql(
            "SELECT reportedstate::text, goalstate::text FROM pgautofailover.node WHERE nodename = %s", (name,)
        )
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    def log(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}" for path in sorted(self.dir.glob("*.log"))
        )

    def wait(self, ready, what: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if ready() is not False:
                    return
            except (psycopg.Error, OSError, IndexError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"waited {timeout_s} s for {what}:\n{self.log()}")
