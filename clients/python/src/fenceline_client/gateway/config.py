"""fenceline-mcp's configuration: the command line, the environment and an optional file (JSON,
or TOML when its name ends in ``.toml``). The file's shape, every key optional but one upstream
(from the file or after ``--`` on the command line)::

    {
      "run": {"external_id": "nightly-42", "run_id": null, "ttl_s": 30},
      "upstreams": {
        "git":  {"command": ["mcp-server-git", "--repository", "/srv/repo"], "env": {"LANG": "C"},
                 "credential": {"principal": "github-bot", "env": "GITHUB_TOKEN"}},
        "docs": {"url": "https://mcp.example/mcp", "headers": {"X-Team": "ops"},
                 "credential": {"principal": "docs-bot", "header": "Authorization", "prefix": "Bearer "}}
      },
      "tools": {
        "git_commit": {"action": "commit", "resource_from": "repo_path", "resource_prefix": "repo:",
                       "approval_wait_s": 600, "credential": true,
                       "budget": {"max_calls": 5, "ttl_s": 3600}}
      },
      "approval_wait_s": 300,
      "call_timeout_s": 120
    }

A tool's contract here is the gateway's own (how to read one call), not the tenant's (what the
effect is: that stays on the server). ``action`` (default: the tool's name) or ``action_from``
(an argument's name); ``resource`` (default: the upstream's name) or ``resource_from`` (an
argument's name, with an optional ``resource_prefix``); ``approval_wait_s``; ``credential``:
take a credential lease of the upstream's principal for the call; ``budget``: a capability
budget the run asks for before the tool's first call on an action and resource.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_APPROVAL_WAIT_S = 300.0
DEFAULT_CALL_TIMEOUT_S = 120.0
SEPARATOR = "__"  # <upstream>__<tool> when there are several upstreams


class ConfigError(ValueError):
    """A configuration that cannot be used: the message names the key."""


@dataclass(frozen=True)
class Credential:
    """The channel a credential reaches an upstream by: an environment variable of a stdio
    upstream (``env``) or a header of an HTTP one (``header``, with ``prefix`` before the secret)."""

    principal: str
    env: str = ""
    header: str = ""
    prefix: str = ""
    ttl_s: int = 60


@dataclass(frozen=True)
class Upstream:
    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    credential: Credential | None = None


@dataclass(frozen=True)
class Budget:
    max_calls: int
    ttl_s: int = 3600
    max_bytes: int | None = None


@dataclass(frozen=True)
class ToolContract:
    action: str = ""
    action_from: str = ""
    resource: str = ""
    resource_from: str = ""
    resource_prefix: str = ""
    approval_wait_s: float | None = None
    credential: bool = False
    budget: Budget | None = None


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    upstreams: tuple[Upstream, ...]
    tools: dict[str, ToolContract] = field(default_factory=dict)
    external_id: str | None = None
    run_id: str | None = None
    ttl_s: int = 30
    approval_wait_s: float = DEFAULT_APPROVAL_WAIT_S
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S

    def contract(self, tool: str) -> ToolContract:
        return self.tools.get(tool) or ToolContract()


def read_file(path: str) -> dict[str, Any]:
    text = Path(path).read_bytes()
    try:
        data = tomllib.loads(text.decode()) if path.endswith(".toml") else json.loads(text)
    except (ValueError, UnicodeDecodeError) as failure:
        raise ConfigError(f"{path}: {failure}") from failure
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the configuration is one object")
    return data


def _token(env: dict[str, str]) -> str:
    if env.get("FENCELINE_TOKEN"):
        return env["FENCELINE_TOKEN"]
    if env.get("FENCELINE_TOKEN_FILE"):
        return Path(env["FENCELINE_TOKEN_FILE"]).read_text().strip()
    raise ConfigError("FENCELINE_TOKEN or FENCELINE_TOKEN_FILE: the worker token the gateway acts with")


def _credential(where: str, raw: Any) -> Credential | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw.get("principal") or not (raw.get("env") or raw.get("header")):
        raise ConfigError(f"{where}.credential: {{principal, env | header}}")
    return Credential(
        principal=str(raw["principal"]),
        env=str(raw.get("env", "")),
        header=str(raw.get("header", "")),
        prefix=str(raw.get("prefix", "")),
        ttl_s=int(raw.get("ttl_s", 60)),
    )


def _upstream(name: str, raw: Any) -> Upstream:
    where = f"upstreams.{name}"
    if not isinstance(raw, dict) or bool(raw.get("command")) == bool(raw.get("url")):
        raise ConfigError(f"{where}: one of command (a list) or url")
    command = raw.get("command") or []
    if isinstance(command, str) or not all(isinstance(part, str) for part in command):
        raise ConfigError(f"{where}.command: a list of strings")
    return Upstream(
        name=name,
        command=tuple(command),
        url=str(raw.get("url", "")),
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        headers={str(k): str(v) for k, v in (raw.get("headers") or {}).items()},
        cwd=raw.get("cwd"),
        credential=_credential(where, raw.get("credential")),
    )


def _contract(name: str, raw: Any) -> ToolContract:
    if not isinstance(raw, dict):
        raise ConfigError(f"tools.{name}: an object")
    budget = raw.get("budget")
    if budget is not None and not (isinstance(budget, dict) and isinstance(budget.get("max_calls"), int)):
        raise ConfigError(f"tools.{name}.budget: {{max_calls, ttl_s?, max_bytes?}}")
    wait = raw.get("approval_wait_s")
    return ToolContract(
        action=str(raw.get("action", "")),
        action_from=str(raw.get("action_from", "")),
        resource=str(raw.get("resource", "")),
        resource_from=str(raw.get("resource_from", "")),
        resource_prefix=str(raw.get("resource_prefix", "")),
        approval_wait_s=float(wait) if wait is not None else None,
        credential=bool(raw.get("credential", False)),
        budget=Budget(int(budget["max_calls"]), int(budget.get("ttl_s", 3600)), budget.get("max_bytes"))
        if budget
        else None,
    )


def build(
    *,
    file: dict[str, Any] | None,
    command: list[str],
    external_id: str | None,
    run_id: str | None,
    env: dict[str, str] | None = None,
) -> Config:
    """The configuration from a file's contents, the command after ``--`` (an upstream named
    after its program) and the command line's run binding over the file's."""
    env = dict(os.environ) if env is None else env
    data = file or {}
    upstreams = [_upstream(str(name), raw) for name, raw in (data.get("upstreams") or {}).items()]
    if command:
        upstreams.append(Upstream(name=Path(command[0]).name or "upstream", command=tuple(command)))
    if not upstreams:
        raise ConfigError("no upstream: give one after -- or in the configuration file's upstreams")
    if len({u.name for u in upstreams}) != len(upstreams):
        raise ConfigError("upstreams: two upstreams have one name")
    if not env.get("FENCELINE_URL"):
        raise ConfigError("FENCELINE_URL: the Fenceline server the gateway reports to")
    run = data.get("run") or {}
    return Config(
        url=env["FENCELINE_URL"],
        token=_token(env),
        upstreams=tuple(upstreams),
        tools={str(name): _contract(str(name), raw) for name, raw in (data.get("tools") or {}).items()},
        external_id=external_id or run.get("external_id"),
        run_id=run_id or run.get("run_id"),
        ttl_s=int(run.get("ttl_s", 30)),
        approval_wait_s=float(data.get("approval_wait_s", DEFAULT_APPROVAL_WAIT_S)),
        call_timeout_s=float(data.get("call_timeout_s", DEFAULT_CALL_TIMEOUT_S)),
    )
