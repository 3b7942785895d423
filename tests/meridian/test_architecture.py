"""The dependency rules of ARCHITECTURE.md ("Packages"), checked on the source: who may import whom.

Components depend on the core, never the other way; the regional tier knows nothing of the global one
and the global tier places no pods; the GNN package talks to neither Redis nor gRPC; node agents make no
decisions. ``meridian_demo`` is the composition root of ``meridian demo`` and may import every tier.
Research lives in ``experiments/`` (as rl-zoo beside Stable-Baselines3): it may import the product,
and no product package imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = {"node_agent", "regional_scheduler", "global_scheduler", "gnn", "meridian_demo"}

# package -> top-level modules it must not import
FORBIDDEN: dict[str, set[str]] = {
    "meridian": COMPONENTS,
    "node_agent": COMPONENTS - {"node_agent"},
    "regional_scheduler": {"global_scheduler", "gnn", "node_agent", "meridian_demo"},
    "global_scheduler": {"regional_scheduler", "node_agent", "meridian_demo"},
    "gnn": {"global_scheduler", "regional_scheduler", "node_agent", "meridian_demo", "redis", "grpc",
            "meridian.bus"},
    "protos": COMPONENTS | {"meridian"},
}


def imports_of(path: Path) -> set[str]:
    """Every absolute module a file imports (``a.b.c`` also counts as ``a`` and ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return out


# The product: every package that ships (pyproject's packages). None of them imports the research in experiments/.
PRODUCT = ("meridian", "meridian_demo", "node_agent", "regional_scheduler", "global_scheduler", "gnn", "protos")
RESEARCH = {"experiments"}


def violations(package: str, banned: set[str] | None = None) -> list[str]:
    banned = FORBIDDEN[package] if banned is None else banned
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue  # generated
        for module in sorted(imports_of(path) & banned):
            found.append(f"{path.relative_to(ROOT)} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_rules(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert violations(package) == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom global_scheduler.registry import ClusterRegistry\nimport redis.client\n")
    assert {"global_scheduler", "global_scheduler.registry", "redis", "redis.client", "os"} <= imports_of(bad)


@pytest.mark.parametrize("package", PRODUCT)
def test_product_never_imports_experiments(package: str) -> None:
    assert (ROOT / package).is_dir() and (ROOT / "experiments").is_dir()
    assert violations(package, RESEARCH) == []


def test_the_checker_sees_an_experiment_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from experiments.carbon_bound import carbon_lower_bound\n")
    assert imports_of(bad) & RESEARCH == {"experiments"}


# The live global scheduler reads its regions from its federation configuration (registry.config_file), never
# from the federation simulator's benchmark table; regions and distances are the core's (meridian.regions).
LIVE_NOT_FROM_SIMULATOR = ("global_scheduler/registry.py", "global_scheduler/federation_config.py")


@pytest.mark.parametrize("module", LIVE_NOT_FROM_SIMULATOR)
def test_live_registry_does_not_import_the_simulator(module: str) -> None:
    assert "global_scheduler.federation_sim" not in imports_of(ROOT / module)


def test_simulator_regions_are_the_core_type() -> None:
    from global_scheduler.federation_sim import REGIONS
    from meridian.regions import Region

    assert REGIONS and all(isinstance(r, Region) for r in REGIONS.values())


# Routing's domain (the cluster and workload snapshots a routing decision reads, and the latency model) is
# shared by the global tier and the GNN's input encoding; since gnn may not import global_scheduler, it lives
# in the core (meridian.routing_domain). The filters only routing applies live in its package. gnn owns the
# network, its graph, its input encoding and its training, and defines none of these.
ROUTING_CONCEPTS: dict[str, str] = {
    **dict.fromkeys(("ClusterFeatures", "WorkloadFeatures", "available_replicas", "utilisation_after", "latency_ms",
                     "crit_utilisation", "slo_ceiling_loss"), "meridian/routing_domain.py"),
    **dict.fromkeys(("feasible_mask", "slo_excess", "slo_safe"), "global_scheduler/routing/feasibility.py"),
}


def top_level_definitions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef | ast.FunctionDef)}


def test_routing_domain_is_defined_once_outside_gnn() -> None:
    homes: dict[str, list[str]] = {name: [] for name in ROUTING_CONCEPTS}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in top_level_definitions(path) & set(ROUTING_CONCEPTS):
                homes[name].append(str(path.relative_to(ROOT)))
    assert homes == {name: [home] for name, home in ROUTING_CONCEPTS.items()}
