"""The deployment gate: compose.yaml and the Dockerfile held to the container baseline.

    python .ci/deploy_gate.py compose.yaml Dockerfile

CI runs it (.ci/run) because there is no container runtime in CI to inspect a running
container with; it reads the files. Each violation is printed as
``compose.yaml: services.web: <rule>: <detail>`` or ``Dockerfile:<line>: <rule>: <detail>``
and the exit status is 1; with none it prints "deployment gate: N services checked, all
rules hold" and exits 0.

A Fenceline service is one built from the Dockerfile (``build:``) or running a
``fenceline`` image; it is held to every rule. Other services (postgres, redis) are held to
the rules marked "all services". A one-shot service (one that another service waits for with
``condition: service_completed_successfully``, such as migrate) needs no healthcheck.

Rules (compose.yaml):
    non-root-user            Fenceline: ``user`` is set and is not root or 0
    read-only-rootfs         Fenceline: ``read_only: true``
    cap-drop-all             Fenceline: ``cap_drop`` holds ALL and there is no ``cap_add``
    no-new-privileges        Fenceline: ``security_opt`` holds no-new-privileges(:true)
    tmpfs-tmp                Fenceline: /tmp is a tmpfs
    no-privileged            all services: no ``privileged: true``
    no-docker-socket         all services: no docker/containerd/podman socket mounted
    no-host-namespaces       all services: no host network, pid, ipc, uts or userns mode
    no-sensitive-host-mounts all services: no bind mount of /, /etc, /root, /home, /proc,
                             /sys, /dev, /run, /var/run, /var/lib/docker, ~ (and ~/.ssh ...),
                             nor of the project directory, .fenceline/ or secrets/
    explicit-writable-mounts all services: every mount is a declared named volume or a
                             read-only bind mount (no anonymous volume, no writable bind mount)
    no-env-file              all services: no ``env_file`` and no variable passed through
                             from the host environment (an ``environment`` entry without a value)
    no-secret-literals       all services: a variable named like *SECRET*, *KEY*, *TOKEN*,
                             *PASSWORD* is a *_FILE (a key id, *_ID, is not a secret), and no
                             value is a URL with a password
    secrets-by-file          all services: every *_FILE variable names /run/secrets/<s> of a
                             secret the service lists; every secret is a top-level ``file:``
                             (not ``environment:``, which inherits the host environment)
    state-cache-volumes      the volumes fenceline-state (durable) and fenceline-cache
                             (disposable) are declared, distinct, and mounted by Fenceline services
    web-readyz-healthcheck   the gunicorn service's healthcheck requests /readyz
    healthcheck-every-service every long-running Fenceline service has an enabled healthcheck
    image-pinned-by-digest   all services: an ``image`` not built here is pinned by @sha256
    no-latest-tag            all services: no image tagged ``latest`` (or untagged, undigested)
    exactly-one-beat         exactly one service runs ``celery ... beat``

Rules (Dockerfile; line continuations, comments and multi-stage builds are understood):
    image-pinned-by-digest   every FROM (other than an earlier stage or scratch) is @sha256:<64 hex>
    no-latest-tag            no FROM image tagged ``latest``
    no-add-url               no ADD from http(s), ftp or git sources
    non-root-user            the final stage sets USER, and the last USER is not root or 0
    no-secret-literals       no ENV or ARG named like a secret, unless it is a *_FILE or *_ID
    no-secret-files-copied   no COPY or ADD of .fenceline, secrets, .env, *.sqlite3 or .git
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

RULES_COMPOSE = (
    "non-root-user",
    "read-only-rootfs",
    "cap-drop-all",
    "no-new-privileges",
    "tmpfs-tmp",
    "no-privileged",
    "no-docker-socket",
    "no-host-namespaces",
    "no-sensitive-host-mounts",
    "explicit-writable-mounts",
    "no-env-file",
    "no-secret-literals",
    "secrets-by-file",
    "state-cache-volumes",
    "web-readyz-healthcheck",
    "healthcheck-every-service",
    "image-pinned-by-digest",
    "no-latest-tag",
    "exactly-one-beat",
)
RULES_DOCKERFILE = (
    "image-pinned-by-digest",
    "no-latest-tag",
    "no-add-url",
    "non-root-user",
    "no-secret-literals",
    "no-secret-files-copied",
)

SCRATCH_DIR = "/tmp"  # noqa: S108 - the path the rule requires a tmpfs on, not a file made here
STATE_VOLUME = "fenceline-state"
CACHE_VOLUME = "fenceline-cache"

SECRET_NAME = re.compile(r"SECRET|KEY|TOKEN|PASSW(OR)?D|CREDENTIAL", re.IGNORECASE)
URL_WITH_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@", re.IGNORECASE)
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
SOCKETS = ("docker.sock", "containerd.sock", "podman.sock", "crio.sock", "dockershim.sock")
SENSITIVE_PREFIXES = (
    "/etc",
    "/root",
    "/home",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/var/run",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/boot",
    "/usr",
    "/lib",
    "/bin",
    "/sbin",
    "~",
)
# Relative to the project directory: the whole checkout, its local state, its secrets, its git.
SENSITIVE_PROJECT_PATHS = (".", ".fenceline", "secrets", ".git", ".venv", ".env")
ROOT_USERS = {"0", "root"}
SECRET_FILES = re.compile(r"(^|/)(\.fenceline|secrets|\.env|\.git)(/|$)|\.sqlite3$")


@dataclass(frozen=True)
class Violation:
    where: str  # "compose.yaml: services.web" or "Dockerfile:12"
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}: {self.detail}"


# --- compose.yaml --------------------------------------------------------------------------


def load_compose(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise ValueError("compose file is not a mapping")
    return doc


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    return [value]


def _environment(service: dict[str, Any]) -> list[tuple[str, str | None]]:
    env = service.get("environment")
    if isinstance(env, dict):
        return [(str(k), None if v is None else str(v)) for k, v in env.items()]
    pairs: list[tuple[str, str | None]] = []
    for item in _as_list(env):
        name, sep, value = str(item).partition("=")
        pairs.append((name, value if sep else None))
    return pairs


def _command_words(service: dict[str, Any]) -> list[str]:
    words: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key)
        words += value.split() if isinstance(value, str) else [str(w) for w in _as_list(value)]
    return words


def is_fenceline(service: dict[str, Any]) -> bool:
    image = str(service.get("image") or "")
    return "build" in service or PurePosixPath(image.split("@")[0].split(":")[0]).name == "fenceline"


def is_beat(service: dict[str, Any]) -> bool:
    words = _command_words(service)
    return any(Path(w).name == "celery" for w in words) and "beat" in words


def is_web(service: dict[str, Any]) -> bool:
    return any(Path(w).name == "gunicorn" for w in _command_words(service))


def one_shot_services(services: dict[str, Any]) -> set[str]:
    names = set()
    for service in services.values():
        depends = service.get("depends_on") if isinstance(service, dict) else None
        if isinstance(depends, dict):
            for name, spec in depends.items():
                if isinstance(spec, dict) and spec.get("condition") == "service_completed_successfully":
                    names.add(name)
    return names


@dataclass(frozen=True)
class Mount:
    kind: str  # "volume", "bind", "tmpfs", "anonymous"
    source: str
    target: str
    read_only: bool


def _mounts(service: dict[str, Any]) -> list[Mount]:
    mounts = []
    for entry in _as_list(service.get("volumes")):
        if isinstance(entry, dict):
            kind = str(entry.get("type", "volume"))
            source = str(entry.get("source") or "")
            target = str(entry.get("target") or "")
            read_only = bool(entry.get("read_only", False))
            if kind == "volume" and not source:
                kind = "anonymous"
        else:
            parts = str(entry).split(":")
            if len(parts) == 1:
                kind, source, target, read_only = "anonymous", "", parts[0], False
            else:
                source, target = parts[0], parts[1]
                options = parts[2].split(",") if len(parts) > 2 else []
                read_only = "ro" in options or "readonly" in options
                kind = "bind" if source.startswith(("/", ".", "~", "$")) else "volume"
        mounts.append(Mount(kind, source, target, read_only))
    return mounts


def _is_socket(mount: Mount) -> bool:
    return any(s in mount.source or s in mount.target for s in SOCKETS)


def _is_sensitive(source: str) -> bool:
    if source.startswith("$"):
        return True  # a path chosen by the host environment cannot be checked
    if source.startswith("/"):
        path = str(PurePosixPath(source))
        return path == "/" or any(path == p or path.startswith(p + "/") for p in SENSITIVE_PREFIXES)
    if source.startswith("~"):
        return True
    relative = str(PurePosixPath(source))
    return any(relative == p or relative.startswith(p + "/") for p in SENSITIVE_PROJECT_PATHS) or relative.startswith(
        ".."
    )


def _tmpfs_targets(service: dict[str, Any]) -> set[str]:
    targets = {str(t).split(":")[0] for t in _as_list(service.get("tmpfs"))}
    targets |= {m.target for m in _mounts(service) if m.kind == "tmpfs"}
    return targets


def _user_is_root(user: Any) -> bool:
    name, _, group = str(user).partition(":")
    return name.strip() in ROOT_USERS or (group != "" and group.strip() in ROOT_USERS) or name.strip() == ""


def _healthcheck_test(service: dict[str, Any]) -> str | None:
    healthcheck = service.get("healthcheck")
    if not isinstance(healthcheck, dict) or healthcheck.get("disable"):
        return None
    test = healthcheck.get("test")
    words = [str(w) for w in _as_list(test)]
    if not words or words[0] == "NONE":
        return None
    return " ".join(words)


def _image_findings(where: str, image: str) -> list[Violation]:
    found = []
    name = image.split("@")[0]
    last = name.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    if tag == "latest" or (tag is None and "@" not in image):
        found.append(Violation(where, "no-latest-tag", f"image {image!r} is tagged latest or not tagged at all"))
    elif not DIGEST.search(image):
        found.append(Violation(where, "image-pinned-by-digest", f"image {image!r} is not pinned by @sha256 digest"))
    return found


def check_service(name: str, service: dict[str, Any], doc: dict[str, Any], one_shot: set[str]) -> list[Violation]:
    where = f"services.{name}"
    found: list[Violation] = []

    def bad(rule: str, detail: str) -> None:
        found.append(Violation(where, rule, detail))

    fenceline = is_fenceline(service)
    if fenceline:
        if "user" not in service or _user_is_root(service["user"]):
            bad("non-root-user", f"user is {service.get('user')!r}; set a non-root uid:gid such as 10001:10001")
        if service.get("read_only") is not True:
            bad("read-only-rootfs", "read_only is not true")
        drops = {str(c).upper() for c in _as_list(service.get("cap_drop"))}
        if "ALL" not in drops or service.get("cap_add"):
            bad("cap-drop-all", "cap_drop must hold ALL and cap_add must be empty")
        options = {str(o).replace("=", ":") for o in _as_list(service.get("security_opt"))}
        if not options & {"no-new-privileges", "no-new-privileges:true"}:
            bad("no-new-privileges", "security_opt lacks no-new-privileges:true")
        if SCRATCH_DIR not in _tmpfs_targets(service):
            bad("tmpfs-tmp", f"{SCRATCH_DIR} is not a tmpfs")
        if name not in one_shot and _healthcheck_test(service) is None:
            bad("healthcheck-every-service", "a long-running Fenceline service without an enabled healthcheck")
        if is_web(service):
            test = _healthcheck_test(service)
            if test is not None and "/readyz" not in test:
                bad("web-readyz-healthcheck", "the web healthcheck does not request /readyz")

    if service.get("privileged"):
        bad("no-privileged", "privileged: true")
    for key in ("network_mode", "pid", "ipc", "uts", "userns_mode"):
        if str(service.get(key) or "") == "host":
            bad("no-host-namespaces", f"{key}: host")

    declared_volumes = set((doc.get("volumes") or {}).keys())
    for mount in _mounts(service):
        if mount.kind == "tmpfs":
            continue
        if _is_socket(mount):
            bad("no-docker-socket", f"{mount.source or mount.target} is mounted")
        elif mount.kind == "bind" and _is_sensitive(mount.source):
            bad("no-sensitive-host-mounts", f"host path {mount.source} is mounted at {mount.target}")
        elif mount.kind == "anonymous":
            bad("explicit-writable-mounts", f"anonymous volume at {mount.target}; name it")
        elif mount.kind == "bind" and not mount.read_only:
            bad("explicit-writable-mounts", f"writable bind mount {mount.source} -> {mount.target}")
        elif mount.kind == "volume" and mount.source not in declared_volumes:
            bad("explicit-writable-mounts", f"volume {mount.source} is not declared under volumes:")

    if "env_file" in service:
        bad("no-env-file", "env_file passes a whole file of variables; list them, secrets by *_FILE")
    service_secrets: set[str] = set()
    secret_targets: set[str] = set()
    for entry in _as_list(service.get("secrets")):
        source = str(entry.get("source") if isinstance(entry, dict) else entry)
        target = str((entry.get("target") if isinstance(entry, dict) else None) or source)
        service_secrets.add(source)
        secret_targets.add(target if target.startswith("/") else f"/run/secrets/{target}")
    for key, value in _environment(service):
        if value is None:
            bad("no-env-file", f"{key} is passed through from the host environment")
            continue
        if key.endswith("_FILE"):
            if value not in secret_targets:
                bad("secrets-by-file", f"{key}={value} is not one of this service's /run/secrets files")
            continue
        if (SECRET_NAME.search(key) and not key.endswith("_ID")) or URL_WITH_PASSWORD.match(value):
            bad("no-secret-literals", f"{key} carries a value; use {key}_FILE and a secret")
    top_secrets = doc.get("secrets") or {}
    for secret in sorted(service_secrets):
        spec = top_secrets.get(secret)
        if not isinstance(spec, dict) or "file" not in spec:
            bad("secrets-by-file", f"secret {secret} is not a top-level secret with file:")

    if "build" not in service:
        image = str(service.get("image") or "")
        found.extend(Violation(where, v.rule, v.detail) for v in _image_findings(where, image))
    elif "image" in service and str(service["image"]).split(":")[-1] == "latest":
        bad("no-latest-tag", f"image {service['image']!r} is tagged latest")
    return found


def check_compose(doc: dict[str, Any]) -> tuple[list[Violation], int]:
    """The violations of ``doc`` (a parsed compose file) and how many services it checked."""
    services = doc.get("services") or {}
    found: list[Violation] = []
    one_shot = one_shot_services(services)
    for name, service in services.items():
        found.extend(check_service(name, service or {}, doc, one_shot))

    for name, spec in (doc.get("secrets") or {}).items():
        if not isinstance(spec, dict) or "file" not in spec:
            found.append(Violation(f"secrets.{name}", "secrets-by-file", "a secret must come from a file"))

    fenceline = {n: s for n, s in services.items() if isinstance(s, dict) and is_fenceline(s)}
    volumes = doc.get("volumes") or {}
    mounted = {m.source for s in fenceline.values() for m in _mounts(s) if m.kind == "volume"}
    for volume in (STATE_VOLUME, CACHE_VOLUME):
        if volume not in volumes or volume not in mounted:
            found.append(
                Violation(
                    "volumes", "state-cache-volumes", f"{volume} must be declared and mounted by a Fenceline service"
                )
            )
    targets: dict[str, set[str]] = {}
    for service in fenceline.values():
        for mount in _mounts(service):
            if mount.source in (STATE_VOLUME, CACHE_VOLUME):
                targets.setdefault(mount.target, set()).add(mount.source)
    if any(len(sources) > 1 for sources in targets.values()):
        found.append(Violation("volumes", "state-cache-volumes", "state and cache share a mount point"))

    webs = [n for n, s in fenceline.items() if is_web(s)]
    if not webs:
        found.append(Violation("services", "web-readyz-healthcheck", "no Fenceline service runs gunicorn"))
    beats = [n for n, s in fenceline.items() if is_beat(s)]
    if len(beats) != 1:
        found.append(
            Violation("services", "exactly-one-beat", f"{len(beats)} beat services: {', '.join(beats) or '-'}")
        )
    return found, len(services)


# --- Dockerfile ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with the line each starts on: comments dropped (also inside a continued
    instruction), continuation lines joined, the ``# escape=`` parser directive honoured."""
    escape = "\\"
    lines = text.splitlines()
    for raw in lines:
        directive = re.match(r"^\s*#\s*(\w+)\s*=\s*(\S+)\s*$", raw)
        if not directive:
            break
        if directive.group(1).lower() == "escape":
            escape = directive.group(2)
    instructions = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue
        if not buffer and not stripped:
            continue
        if not buffer:
            start = number
        if stripped.endswith(escape):
            buffer.append(stripped[: -len(escape)])
            continue
        buffer.append(stripped)
        joined = " ".join(part.strip() for part in buffer if part.strip())
        buffer = []
        keyword, _, args = joined.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
    if buffer:
        joined = " ".join(part.strip() for part in buffer if part.strip())
        keyword, _, args = joined.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
    return instructions


def _words(args: str) -> list[str]:
    """An instruction's arguments, exec (JSON array) form or shell form, without --flags."""
    if args.startswith("["):
        try:
            value = yaml.safe_load(args)
        except yaml.YAMLError:
            value = None
        if isinstance(value, list):
            return [str(v) for v in value]
    return [w for w in args.split() if not w.startswith("--")]


def _env_names(keyword: str, args: str) -> list[str]:
    if keyword == "ARG":
        return [w.split("=", 1)[0] for w in args.split()]
    words = args.split()
    if words and "=" not in words[0]:
        return [words[0]]  # the legacy form: ENV NAME value
    return [w.split("=", 1)[0] for w in re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*=)", " " + args)]


def check_dockerfile(text: str) -> list[Violation]:
    found: list[Violation] = []
    stages: set[str] = set()
    final_users: list[Instruction] = []
    seen_from = False
    for ins in parse_dockerfile(text):
        where = f"Dockerfile:{ins.line}"
        if ins.keyword == "FROM":
            seen_from = True
            final_users = []
            words = [w for w in ins.args.split() if not w.startswith("--")]
            image = words[0] if words else ""
            alias = words[2].lower() if len(words) >= 3 and words[1].upper() == "AS" else None
            if image.lower() not in stages and image != "scratch":
                found.extend(Violation(where, v.rule, v.detail) for v in _image_findings(where, image))
            if alias:
                stages.add(alias)
        elif ins.keyword == "USER":
            final_users.append(ins)
        elif ins.keyword in {"ADD", "COPY"}:
            sources = _words(ins.args)[:-1]
            for source in sources:
                if ins.keyword == "ADD" and re.match(r"^(https?|ftp|git)://|^git@", source):
                    found.append(Violation(where, "no-add-url", f"ADD {source}: fetch in a RUN step with a checksum"))
                elif SECRET_FILES.search(source.rstrip("/")):
                    found.append(Violation(where, "no-secret-files-copied", f"{ins.keyword} {source}"))
        elif ins.keyword in {"ENV", "ARG"}:
            for name in _env_names(ins.keyword, ins.args):
                if SECRET_NAME.search(name) and not name.endswith(("_FILE", "_ID")):
                    found.append(Violation(where, "no-secret-literals", f"{ins.keyword} {name} bakes a secret in"))
    if not seen_from:
        found.append(Violation("Dockerfile", "image-pinned-by-digest", "no FROM"))
    if not final_users:
        found.append(Violation("Dockerfile", "non-root-user", "the final stage sets no USER (it runs as root)"))
    elif _user_is_root(final_users[-1].args):
        found.append(Violation(f"Dockerfile:{final_users[-1].line}", "non-root-user", f"USER {final_users[-1].args}"))
    return found


# --- command line --------------------------------------------------------------------------


def run(compose_path: Path, dockerfile_path: Path) -> tuple[list[str], int]:
    """The printed violations (with file names) and the number of services checked."""
    doc = load_compose(compose_path.read_text())
    compose_found, count = check_compose(doc)
    lines = [f"{compose_path.name}: {v}" for v in compose_found]
    for v in check_dockerfile(dockerfile_path.read_text()):
        where = v.where.replace("Dockerfile", dockerfile_path.name, 1)
        lines.append(f"{where}: {v.rule}: {v.detail}")
    return lines, count


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: deploy_gate.py compose.yaml Dockerfile", file=sys.stderr)
        return 2
    try:
        lines, count = run(Path(argv[0]), Path(argv[1]))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"deployment gate: cannot read the files: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    if lines:
        print(f"deployment gate: {len(lines)} violation(s)", file=sys.stderr)
        return 1
    print(f"deployment gate: {count} services checked, all rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
