"""The examples of docs/openai-agents.md and docs/langgraph.md run exactly as the pages show
them: the first ``python`` block under "## Example" is written to a file and run as a worker
process against the live server, with a person approving the charge it waits for."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from approvals.services.approvals import approval_decide
from tests.factories import set_policy

DOCS = Path(__file__).resolve().parents[3] / "docs"


def example(page: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    section = text.split("\n## Example\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, f"{page} shows a python example under '## Example'"
    return found.group(1)


@pytest.mark.parametrize(
    "page, last_line",
    [
        ("openai-agents.md", "Done: charged 500 cents (ch_881_500)"),
        ("langgraph.md", "charged 500 cents (ch_881_500)"),
    ],
)
def test_the_example_runs_as_written_and_waits_for_the_person(page, last_line, live_server, acme, approver, tmp_path):
    set_policy(acme.tenant, human_approval_tools=["charge"], reason="every charge is approved by a person")
    script = tmp_path / "example.py"
    script.write_text(example(page), encoding="utf-8")
    env = {**os.environ, "FENCELINE_URL": live_server.url, "FENCELINE_TOKEN": acme.token, "PYTHONPATH": ""}
    process = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()
        waiting = re.match(r"waiting for approval ([0-9a-f-]{36}) of charge$", line.strip())
        assert waiting, (line, process.stderr.read() if process.poll() is not None else "")
        approval_decide(approval_id=waiting.group(1), approve=True, reason="invoice checked", user=approver)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.strip().splitlines()[-1] == last_line
