"""Imports of the project's own modules sit at the top of a module, where a reader and the
import contracts (``lint-imports``, pyproject.toml) see them: an import tucked inside a
function to dodge a cycle is a boundary that only looks one-way. The one exception is
Django's idiom, an AppConfig's ``ready()`` importing to register things at start-up."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "approvals", "console")
FIRST_PARTY = {"ledger", "approvals", "console", "fenceline_client"}


def modules() -> list[Path]:
    return sorted(
        path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if "migrations" not in path.parts
    )


def first_party(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        name = "." * node.level + (node.module or "")
        return [name] if node.level or name.split(".")[0] in FIRST_PARTY else []
    return [alias.name for alias in node.names if alias.name.split(".")[0] in FIRST_PARTY]


def is_app_config(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Name) and b.id == "AppConfig") or (isinstance(b, ast.Attribute) and b.attr == "AppConfig")
        for b in node.bases
    )


def imports_in_functions(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, function, module) of every first-party import inside a function body, except in
    an AppConfig's ready()."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str | None, in_app_config: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, function, function is None and is_app_config(child))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                allowed = in_app_config and function is None and child.name == "ready"
                visit(child, None if allowed else child.name, False)
            else:
                if function is not None and isinstance(child, ast.Import | ast.ImportFrom):
                    found.extend((child.lineno, function, name) for name in first_party(child))
                visit(child, function, in_app_config)

    visit(tree, None, False)
    return found


def test_no_first_party_import_hides_inside_a_function():
    hidden = [
        f"{path.relative_to(ROOT)}:{line} in {function}(): {name}"
        for path in modules()
        for line, function, name in imports_in_functions(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert not hidden, "first-party imports belong at the top of the module:\n" + "\n".join(hidden)


def test_the_rule_finds_an_import_in_a_function_and_spares_ready():
    source = """
from django.apps import AppConfig
import ledger.models


class LedgerConfig(AppConfig):
    def ready(self):
        from ledger import tasks


def read():
    from approvals.models import ReconciliationCase
    import json


class Collector:
    def collect(self):
        from .models import Run

        def inner():
            import console.celery
"""
    found = imports_in_functions(ast.parse(source))
    assert found == [
        (12, "read", "approvals.models"),
        (18, "collect", ".models"),
        (21, "inner", "console.celery"),
    ]
