"""No function in the product is longer than one can hold in one's head (80 lines).

Every function and method of the product packages (not the tests, not ``experiments/``, not generated
protobuf code) is measured on the source with ``ast`` (``end_lineno - lineno + 1``: decorators aside,
signature to last line, docstring included); none may be longer than ``LIMIT``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("meridian", "meridian_demo", "node_agent", "regional_scheduler", "global_scheduler", "gnn")
LIMIT = 80

def _generated(path: Path) -> bool:
    return "_pb2" in path.name


def function_lengths(node: ast.AST, path: str, prefix: str = "") -> dict[str, int]:
    """``path::qualified.name`` -> lines, for every function under ``node`` (nested ones too)."""
    out: dict[str, int] = {}
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + child.name
            out[f"{path}::{name}"] = child.end_lineno - child.lineno + 1
            out.update(function_lengths(child, path, name + "."))
        elif isinstance(child, ast.ClassDef):
            out.update(function_lengths(child, path, prefix + child.name + "."))
        else:
            out.update(function_lengths(child, path, prefix))
    return out


def product_functions() -> dict[str, int]:
    out: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if _generated(path):
                continue
            rel = path.relative_to(ROOT).as_posix()
            out.update(function_lengths(ast.parse(path.read_text(), filename=rel), rel))
    return out


def test_the_measure_counts_signature_to_last_line() -> None:
    source = "class A:\n    def f(self):\n        def g():\n            return 1\n        return g\n"
    assert function_lengths(ast.parse(source), "m.py") == {"m.py::A.f": 4, "m.py::A.f.g": 2}


def test_no_function_is_longer_than_the_limit() -> None:
    long = {name: n for name, n in product_functions().items() if n > LIMIT}
    assert not long, (f"functions over {LIMIT} lines (split them into named steps): "
                     + ", ".join(f"{name} ({n})" for name, n in sorted(long.items())))
