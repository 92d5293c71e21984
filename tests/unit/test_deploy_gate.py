"""The deployment gate (.ci/deploy_gate.py): the committed compose.yaml and Dockerfile pass,
and each baseline rule fails on one violation of it (no container runtime is needed)."""

import copy
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GATE_PATH = ROOT / ".ci" / "deploy_gate.py"

_spec = importlib.util.spec_from_file_location("deploy_gate", GATE_PATH)
assert _spec is not None and _spec.loader is not None
gate = importlib.util.module_from_spec(_spec)
sys.modules["deploy_gate"] = gate
_spec.loader.exec_module(gate)

COMPOSE = gate.load_compose((ROOT / "compose.yaml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def compose_rules(doc):
    found, _count = gate.check_compose(doc)
    return {v.rule for v in found}


def dockerfile_rules(text):
    return {v.rule for v in gate.check_dockerfile(text)}


# --- the committed files -----------------------------------------------------------------


def test_committed_files_pass():
    found, count = gate.check_compose(copy.deepcopy(COMPOSE))
    assert found == []
    assert count == 6
    assert gate.check_dockerfile(DOCKERFILE) == []


def test_command_line_passes_on_committed_files():
    result = subprocess.run(
        [sys.executable, str(GATE_PATH), "compose.yaml", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "deployment gate: 6 services checked, all rules hold"


def test_command_line_prints_each_violation_and_exits_1(tmp_path):
    text = (ROOT / "compose.yaml").read_text().replace('  read_only: true\n  cap_drop: ["ALL"]\n', "", 1)
    (tmp_path / "compose.yaml").write_text(text)
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.replace("USER 10001:10001", "USER root"))
    result = subprocess.run(
        [sys.executable, str(GATE_PATH), "compose.yaml", "Dockerfile"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    # The anchor is shared: every Fenceline service loses read_only and cap_drop.
    for service in ("migrate", "web", "worker", "beat"):
        assert any(line.startswith(f"compose.yaml: services.{service}: read-only-rootfs: ") for line in lines)
        assert any(line.startswith(f"compose.yaml: services.{service}: cap-drop-all: ") for line in lines)
    user_line = next(n for n, line in enumerate(DOCKERFILE.splitlines(), 1) if line.startswith("USER "))
    assert f"Dockerfile:{user_line}: non-root-user: USER root" in lines
    assert len(lines) == 9


# --- one violation each, compose.yaml ----------------------------------------------------


def _set(service, key, value):
    def mutate(doc):
        doc["services"][service][key] = value

    return mutate


def _drop(service, key):
    def mutate(doc):
        del doc["services"][service][key]

    return mutate


def _add_volume(service, entry):
    def mutate(doc):
        doc["services"][service]["volumes"].append(entry)

    return mutate


def _set_env(service, key, value):
    def mutate(doc):
        doc["services"][service]["environment"][key] = value

    return mutate


def _secret_from_environment(doc):
    doc["secrets"]["django_secret_key"] = {"environment": "DJANGO_SECRET_KEY"}


def _file_var_outside_secrets(doc):
    doc["services"]["worker"]["environment"]["FENCELINE_EVENT_KEYS_FILE"] = "/var/cache/fenceline/event_keys"


def _one_volume_for_state_and_cache(doc):
    del doc["volumes"]["fenceline-cache"]
    for service in doc["services"].values():
        service["volumes"] = [
            v.replace("fenceline-cache:", "fenceline-state:") if isinstance(v, str) else v
            for v in service.get("volumes", [])
        ]
    # beat mounted both; one opaque volume is left, mounted twice
    beat = doc["services"]["beat"]
    beat["volumes"] = [v for v in beat["volumes"] if not v.startswith("fenceline-state:/var/cache")]


def _web_checks_healthz(doc):
    doc["services"]["web"]["healthcheck"]["test"] = [
        "CMD",
        "python",
        "-m",
        "console.healthcheck",
        "http://127.0.0.1:8000/healthz",
    ]


def _disable_beat_healthcheck(doc):
    doc["services"]["beat"]["healthcheck"] = {"disable": True}


def _second_beat(doc):
    doc["services"]["beat-2"] = copy.deepcopy(doc["services"]["beat"])


COMPOSE_CASES = {
    "non-root-user": _set("web", "user", "0:0"),
    "non-root-user/unset": _drop("worker", "user"),
    "read-only-rootfs": _set("web", "read_only", False),
    "cap-drop-all": _set("worker", "cap_drop", ["NET_RAW"]),
    "cap-drop-all/cap_add": _set("worker", "cap_add", ["NET_ADMIN"]),
    "no-new-privileges": _drop("beat", "security_opt"),
    "tmpfs-tmp": _set("web", "tmpfs", ["/run/fenceline/prometheus:rw,noexec,nosuid,size=32m"]),
    "no-privileged": _set("worker", "privileged", True),
    "no-privileged/postgres": _set("postgres", "privileged", True),
    "no-docker-socket": _add_volume("worker", "/var/run/docker.sock:/var/run/docker.sock:ro"),
    "no-host-namespaces": _set("web", "network_mode", "host"),
    "no-host-namespaces/pid": _set("redis", "pid", "host"),
    "no-sensitive-host-mounts": _add_volume("worker", "~/.ssh:/home/fenceline/.ssh:ro"),
    "no-sensitive-host-mounts/project": _add_volume("web", ".:/app:ro"),
    "no-sensitive-host-mounts/etc": _add_volume("postgres", "/etc:/host-etc:ro"),
    "explicit-writable-mounts": _add_volume("worker", "./artifacts:/var/lib/fenceline/artifacts"),
    "explicit-writable-mounts/anonymous": _add_volume("web", "/var/lib/fenceline/scratch"),
    "no-env-file": _set("web", "env_file", [".env"]),
    "no-env-file/pass-through": _set_env("worker", "FENCELINE_LOG_LEVEL", None),
    "no-secret-literals": _set_env("web", "DJANGO_SECRET_KEY", "not-a-real-key"),
    "no-secret-literals/url": _set_env("worker", "CELERY_BROKER_URL", "redis://:hunter2@redis:6379/0"),
    "no-secret-literals/postgres": _set_env("postgres", "POSTGRES_PASSWORD", "hunter2"),
    "secrets-by-file": _secret_from_environment,
    "secrets-by-file/path": _file_var_outside_secrets,
    "state-cache-volumes": _one_volume_for_state_and_cache,
    "web-readyz-healthcheck": _web_checks_healthz,
    "healthcheck-every-service": _drop("worker", "healthcheck"),
    "healthcheck-every-service/disabled": _disable_beat_healthcheck,
    "image-pinned-by-digest": _set("postgres", "image", "postgres:17-alpine"),
    "no-latest-tag": _set("redis", "image", "redis:latest"),
    "no-latest-tag/untagged": _set("redis", "image", "redis"),
    "exactly-one-beat": _second_beat,
}


@pytest.mark.parametrize("case", sorted(COMPOSE_CASES))
def test_compose_violation_is_reported_as_its_rule(case):
    doc = copy.deepcopy(COMPOSE)
    COMPOSE_CASES[case](doc)
    assert compose_rules(doc) == {case.split("/")[0]}


# --- one violation each, Dockerfile ------------------------------------------------------

# python:3.13-slim@sha256:<64 hex>, of the first FROM instruction
DIGEST_PIN = next(line.split()[1] for line in DOCKERFILE.splitlines() if line.startswith("FROM "))


def _before_user(text, instruction):
    return text.replace("USER 10001:10001", f"{instruction}\nUSER 10001:10001", 1)


DOCKERFILE_CASES = {
    "image-pinned-by-digest": DOCKERFILE.replace(DIGEST_PIN, "python:3.13-slim", 1),
    "image-pinned-by-digest/short": DOCKERFILE.replace(DIGEST_PIN, "python:3.13-slim@sha256:7c61056e", 1),
    "no-latest-tag": DOCKERFILE.replace(DIGEST_PIN, "python:latest", 1),
    "no-add-url": _before_user(DOCKERFILE, "ADD https://example.com/tool.tar.gz /opt/"),
    "non-root-user": DOCKERFILE.replace("USER 10001:10001", "USER 0"),
    "non-root-user/unset": DOCKERFILE.replace("USER 10001:10001\n", ""),
    "non-root-user/root-after": DOCKERFILE + "\nUSER root\n",
    "no-secret-literals": _before_user(DOCKERFILE, "ENV DJANGO_SECRET_KEY=not-a-real-key"),
    "no-secret-literals/arg": _before_user(DOCKERFILE, "ARG FENCELINE_METRICS_TOKEN"),
    "no-secret-literals/continued": DOCKERFILE.replace(
        "    PYTHONUNBUFFERED=1 \\\n", "    PYTHONUNBUFFERED=1 \\\n    FENCELINE_EVENT_KEYS=k1:AAAA \\\n", 1
    ),
    "no-secret-files-copied": _before_user(DOCKERFILE, "COPY .fenceline/ /app/.fenceline/"),
    "no-secret-files-copied/secrets": _before_user(DOCKERFILE, "COPY --chown=10001:10001 secrets/ /run/secrets/"),
}


@pytest.mark.parametrize("case", sorted(DOCKERFILE_CASES))
def test_dockerfile_violation_is_reported_as_its_rule(case):
    assert DOCKERFILE_CASES[case] != DOCKERFILE
    assert dockerfile_rules(DOCKERFILE_CASES[case]) == {case.split("/")[0]}


def test_key_ids_and_file_names_are_not_secret_literals():
    doc = copy.deepcopy(COMPOSE)
    doc["services"]["worker"]["environment"]["FENCELINE_EVENT_SIGNING_KEY_ID"] = "k2"
    assert compose_rules(doc) == set()
    assert dockerfile_rules(_before_user(DOCKERFILE, "ENV FENCELINE_CHECKPOINT_SIGNING_KEY_ID=k2")) == set()


def test_every_rule_has_a_failing_case():
    assert {c.split("/")[0] for c in COMPOSE_CASES} == set(gate.RULES_COMPOSE)
    assert {c.split("/")[0] for c in DOCKERFILE_CASES} == set(gate.RULES_DOCKERFILE)
    for rule in (*gate.RULES_COMPOSE, *gate.RULES_DOCKERFILE):
        assert rule in gate.__doc__


# --- the Dockerfile parser ---------------------------------------------------------------


def test_dockerfile_parser_joins_continuations_and_drops_comments():
    text = (
        "# syntax=docker/dockerfile:1\n"
        "FROM python:3.13-slim@sha256:" + "a" * 64 + " AS build\n"
        "RUN echo one \\\n"
        "    # a comment inside the instruction\n"
        "    && echo two\n"
        "\n"
        "FROM build\n"
        "USER 10001\n"
    )
    instructions = gate.parse_dockerfile(text)
    assert [(i.line, i.keyword) for i in instructions] == [(2, "FROM"), (3, "RUN"), (7, "FROM"), (8, "USER")]
    assert instructions[1].args == "echo one && echo two"
    # A FROM naming an earlier stage needs no digest; the final stage's USER counts.
    assert gate.check_dockerfile(text) == []


def test_dockerfile_user_of_an_earlier_stage_does_not_count():
    text = "FROM python:3.13-slim@sha256:" + "a" * 64 + " AS build\nUSER 10001\nFROM build\nRUN true\n"
    assert dockerfile_rules(text) == {"non-root-user"}


def test_violation_lines_name_the_instruction_line():
    text = DOCKERFILE.replace(DIGEST_PIN, "python:3.13-slim", 1)
    line = next(n for n, raw in enumerate(DOCKERFILE.splitlines(), 1) if raw.startswith("FROM "))
    [violation] = gate.check_dockerfile(text)
    assert violation.where == f"Dockerfile:{line}"


# --- console/healthcheck.py --------------------------------------------------------------


def test_healthcheck_fresh_file(tmp_path):
    from console.healthcheck import check_fresh_file

    schedule = tmp_path / "celerybeat-schedule"
    assert check_fresh_file(schedule, 600)[0] is False
    schedule.write_text("x")
    assert check_fresh_file(schedule, 600)[0] is True
    assert check_fresh_file(schedule, 600, now=time.time() + 3600)[0] is False
    # a dbm backend that writes PATH.db beside the name given
    schedule.unlink()
    (tmp_path / "celerybeat-schedule.db").write_text("x")
    assert check_fresh_file(schedule, 600)[0] is True


def test_healthcheck_url_answers_only_200_and_prints_no_body(live_server_url_factory):
    from console.healthcheck import check_url

    url = live_server_url_factory
    assert check_url(url("/ok"), 2) == (True, "healthy: HTTP 200")
    assert check_url(url("/down"), 2) == (False, "unhealthy: HTTP 503")
    # a redirect is not followed to a page that answers 200
    assert check_url(url("/moved"), 2) == (False, "unhealthy: HTTP 302")
    assert check_url("file:///etc/passwd", 2)[0] is False


@pytest.fixture
def live_server_url_factory():
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/ok":
                self.send_response(200)
            elif self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/ok")
            else:
                self.send_response(503)
            self.end_headers()
            self.wfile.write(b"secret-looking body")

        def log_message(self, format, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield lambda path: f"http://127.0.0.1:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()
