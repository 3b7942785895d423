"""No function in the product is longer than one can hold in one's head (issue 25: 80 lines).

Every function and method of the product packages (not the tests, not ``experiments/``) is measured
on the source with ``ast`` (``end_lineno - lineno + 1``: decorators aside, signature to last line,
docstring included). The ones longer than ``LIMIT`` today are listed in ``ALLOWED`` with their
length: none may grow, a new one fails, and an entry whose function was split (or removed) must go,
so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("meridian", "meridian_demo", "node_agent", "regional_scheduler", "global_scheduler", "gnn")
LIMIT = 80

# "path::qualified.name" -> its length in lines today. Split one, then remove its entry.
ALLOWED: dict[str, int] = {
    "meridian/envtest.py::ControlPlane._start_local_once": 87,
    "meridian_demo/bench_federation.py::run": 110,
    "meridian_demo/cli.py::live_part": 89,
    "regional_scheduler/kube_cli.py::regional_scheduler_command": 132,
    "regional_scheduler/learned/algorithm.py::train_profile": 106,
    "regional_scheduler/learned/commands.py::train_placement": 177,
    "regional_scheduler/telemetry_cli.py::bench_telemetry": 183,
    "global_scheduler/bench_api.py::_hostile_main": 123,
    "global_scheduler/bench_api.py::run_hostile_api_bench": 86,
    "global_scheduler/bench_api.py::run_ha_api_bench": 145,
    "global_scheduler/energy_cli.py::register": 88,
    "global_scheduler/energy_cli.py::register.energy_report": 84,
}


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


def test_no_new_function_is_longer_than_the_limit() -> None:
    long = {name: n for name, n in product_functions().items() if n > LIMIT}
    new = {name: n for name, n in long.items() if name not in ALLOWED}
    assert not new, (f"functions over {LIMIT} lines (split them into named steps): "
                     + ", ".join(f"{name} ({n})" for name, n in sorted(new.items())))


def test_no_listed_function_grows() -> None:
    lengths = product_functions()
    grown = {name: (ALLOWED[name], n) for name, n in lengths.items() if name in ALLOWED and n > ALLOWED[name]}
    assert not grown, "listed functions that grew (allowed → now): " + ", ".join(
        f"{name} ({was} → {now})" for name, (was, now) in sorted(grown.items()))


def test_the_list_names_only_functions_still_over_the_limit() -> None:
    lengths = product_functions()
    stale = sorted(name for name in ALLOWED if lengths.get(name, 0) <= LIMIT)
    assert not stale, f"split or gone, remove from ALLOWED: {', '.join(stale)}"
