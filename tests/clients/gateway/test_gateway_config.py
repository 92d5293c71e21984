"""fenceline-mcp's configuration (docs/gateway.md): a JSON or TOML file and the command line make
one Config; a configuration that cannot be used stops the gateway before it starts anything,
with exit status 2 and one line naming what is wrong."""

import subprocess

import pytest

from fenceline_client.gateway.config import ConfigError, build, read_file
from tests.clients.gateway.conftest import BIN

ENV = {"FENCELINE_URL": "http://127.0.0.1:9", "FENCELINE_TOKEN": "flw_test"}


def test_a_toml_file_and_the_command_line_make_one_configuration(tmp_path):
    path = tmp_path / "gateway.toml"
    path.write_text(
        """
approval_wait_s = 60
[run]
external_id = "from-the-file"
[upstreams.git]
command = ["mcp-server-git", "--repository", "/srv/repo"]
[tools.git__git_commit]
action = "commit"
resource_from = "repo_path"
resource_prefix = "repo:"
budget = {max_calls = 2}
"""
    )
    config = build(
        file=read_file(str(path)), command=["node", "fs.js"], external_id="from-the-flag", run_id=None, env=ENV
    )
    assert [u.name for u in config.upstreams] == ["git", "node"]
    assert config.external_id == "from-the-flag" and config.approval_wait_s == 60
    commit = config.contract("git__git_commit")
    assert (commit.action, commit.resource_from, commit.resource_prefix, commit.budget.max_calls) == (
        "commit",
        "repo_path",
        "repo:",
        2,
    )
    assert config.contract("git__git_log").action == ""  # no contract: the defaults


@pytest.mark.parametrize(
    "file, env, problem",
    [
        (None, ENV, "no upstream"),
        ({"upstreams": ["mcp-server-git"]}, ENV, "upstreams: an object"),
        ({"upstreams": {"git": {"command": "mcp-server-git"}}}, ENV, "upstreams.git.command: a list of strings"),
        ({"upstreams": {"git": {"url": "http://x/mcp", "command": ["y"]}}}, ENV, "upstreams.git: one of command"),
        ({"upstreams": {"g": {"command": ["y"], "credential": {"principal": "p"}}}}, ENV, "upstreams.g.credential"),
        ({"upstreams": {"g": {"command": ["y"]}}, "tools": {"t": {"budget": {}}}}, ENV, "tools.t.budget"),
        ({"upstreams": {"g": {"command": ["y"]}}}, {"FENCELINE_TOKEN": "flw_test"}, "FENCELINE_URL"),
        ({"upstreams": {"g": {"command": ["y"]}}}, {"FENCELINE_URL": "http://x"}, "FENCELINE_TOKEN"),
    ],
)
def test_a_configuration_that_cannot_be_used_names_what_is_wrong(file, env, problem):
    with pytest.raises(ConfigError, match=problem):
        build(file=file, command=[], external_id=None, run_id=None, env=env)


def test_the_command_refuses_a_bad_configuration_with_one_line_and_status_2(tmp_path):
    (tmp_path / "bad.json").write_text('{"upstreams": [1, 2]')
    done = subprocess.run(
        [str(BIN / "fenceline-mcp"), "--config", str(tmp_path / "bad.json")],
        env={**ENV, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"fenceline-mcp: {tmp_path / 'bad.json'}: ") and done.stderr.count("\n") == 1
