"""With DATABASE_URL unset Fenceline runs on an embedded PostgreSQL: the first process that
connects starts it, the last one to exit stops it, and a process killed outright does not
keep it up for ever."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def embedded_env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    return env | {"FENCELINE_STATE_DIR": str(state_dir), "FENCELINE_LOG_FORMAT": "plain"}


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def running(state_dir: Path) -> bool:
    return (state_dir / "postgres" / "postmaster.pid").exists()


def test_a_command_starts_the_embedded_server_and_stops_it_when_it_exits(state_dir):
    env = embedded_env(state_dir)
    done = manage(
        env,
        "shell",
        "-c",
        "from django.db import connection; print(connection.cursor().connection.info.server_version)",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) >= 180000  # the wheel's PostgreSQL 18, not the machine's
    assert (state_dir / "postgres" / "PG_VERSION").exists()
    assert not running(state_dir)
    # Nothing listens on TCP: the socket lives in the data directory.
    assert list((state_dir / "postgres").glob(".s.PGSQL.*")) == []  # removed as it stopped


def test_a_process_killed_outright_does_not_keep_the_server_up(state_dir):
    env = embedded_env(state_dir)
    holder = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "shell",
            "--no-imports",
            "-c",
            "from django.db import connection; connection.ensure_connection(); print('up', flush=True); "
            "import time; time.sleep(600)",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "up"
        assert running(state_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert running(state_dir)  # nobody stopped it: the holder died without a word
    # The next process forgets the dead one, and stops the server as the last live user.
    done = manage(env, "showmigrations", "--plan")
    assert done.returncode == 0, done.stderr[-2000:]
    deadline = time.monotonic() + 10
    while running(state_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(state_dir)


@pytest.mark.parametrize("url", ["sqlite:///tmp/fenceline.sqlite3", "mysql://root@127.0.0.1/fenceline"])
def test_a_database_url_that_is_not_postgresql_stops_start_up_naming_it(state_dir, url):
    env = embedded_env(state_dir) | {"DATABASE_URL": url}
    done = manage(env, "check")
    assert done.returncode != 0
    assert "DATABASE_URL must point at PostgreSQL" in done.stderr
    assert not (state_dir / "postgres").exists()


def holder(env: dict[str, str], seconds: int) -> subprocess.Popen[str]:
    """A process that connects (so it uses the server), says so, and sleeps ``seconds``."""
    code = (
        "from django.db import connection; connection.ensure_connection(); print('up', flush=True); "
        f"import time; time.sleep({seconds})"
    )
    process = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "up"
    return process


def test_the_last_live_user_stops_the_server_though_another_was_killed_outright(state_dir):
    env = embedded_env(state_dir)
    killed, last = holder(env, 600), holder(env, 3)
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    assert last.wait(30) == 0
    deadline = time.monotonic() + 10
    while running(state_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(state_dir)


def test_the_demo_stopped_by_sigterm_stops_its_jobs_and_the_database(state_dir):
    env = embedded_env(state_dir)
    port = 18000 + os.getpid() % 1000
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # the demo announces itself once the server answers
            if line.startswith("Fenceline demo at"):
                break
        else:
            raise AssertionError("the demo never came up")
        jobs = subprocess.run(["pgrep", "-f", f"celery.*{state_dir}"], capture_output=True, text=True).stdout.split()
        assert jobs, "the demo starts its background jobs"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(30) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
    deadline = time.monotonic() + 20
    while (running(state_dir) or subprocess.run(["pgrep", "-f", f"celery.*{state_dir}"]).returncode == 0) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert subprocess.run(["pgrep", "-f", f"celery.*{state_dir}"]).returncode == 1  # no job left behind
    assert not running(state_dir)
