"""A function a reader can hold: no product function is longer than 60 lines (the
standalone verifier, the one file that defines the chain's check for readers outside
Fenceline, excepted)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("ledger", "approvals", "console", "clients/python/src")
EXCEPTED = {"clients/python/src/fenceline_client/evidence_verifier.py"}
MAX_LINES = 60


def product_functions():
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative or relative in EXCEPTED:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=relative)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield relative, node


def test_no_product_function_is_longer_than_sixty_lines():
    long = [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, node in product_functions()
        if node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert long == [], "\n".join(long)


def test_the_scan_sees_the_product():
    assert sum(1 for _ in product_functions()) > 1000
