"""docs/providers.md runs as written: every python block executes, and every JSON block of
reconcilers builds (its python path pointed at the doc's own example factory) and passes the
start-up check with the references it names set."""

import json
import re
import sys
import types
from pathlib import Path

import pytest

from ledger.services.reconciliation.checks import reconcilers_check
from tests.ledger.reconciliation.conftest import configure

DOC = Path(__file__).resolve().parents[3] / "docs" / "providers.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("code", blocks("python"))
def test_each_python_block_runs(code):
    exec(compile(code, str(DOC), "exec"), {"__name__": "providers_doc"})  # noqa: S102 - the doc's own code


def test_the_configuration_example_builds_and_passes_the_check(settings, monkeypatch, tmp_path):
    [example] = blocks("json")
    reconcilers = json.loads(example)
    module = types.ModuleType("myco.reconcilers")
    exec(compile(blocks("python")[-1], str(DOC), "exec"), module.__dict__)  # noqa: S102
    monkeypatch.setitem(sys.modules, "myco", types.ModuleType("myco"))
    monkeypatch.setitem(sys.modules, "myco.reconcilers", module)
    token = tmp_path / "github-token"
    token.write_text("gh-test-value\n")
    reconcilers["github"]["auth"]["secret"] = f"file:{token}"
    for name in ("STRIPE_SECRET_KEY", "SLACK_BOT_TOKEN", "LEDGER_API_KEY"):
        monkeypatch.setenv(name, "test-value")
    monkeypatch.setenv("IMAP_LOGIN", "billing:test-value")
    configure(settings, "x", {})
    settings.FENCELINE = {**settings.FENCELINE, "RECONCILERS": reconcilers}

    assert reconcilers_check() == []
