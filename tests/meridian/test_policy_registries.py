"""The three policy registries share one scheme (meridian.policy_registry; issue 25 item 3).

Placement, routing and autoscaling each expose ``REGISTRY`` (a :class:`PolicyRegistry` of
``"package.module:build"`` strings), ``names()``, ``get_policy(name, **kwargs)`` and ``BASELINES``;
every key is the name constant of its module (``NAME`` for ``build``, ``<VARIANT>_NAME`` for
``build_<variant>``), constructing it builds a policy of that name, and reading the names imports no
policy module.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from meridian.policy_registry import PolicyRegistry, UnknownPolicyError, name_constant, split_target

REPO = Path(__file__).resolve().parents[2]
REGISTRIES = {
    "placement": "regional_scheduler.policies.registry",
    "routing": "global_scheduler.routing.registry",
    "autoscaling": "regional_scheduler.autoscaling.policies.registry",
}


def _registry(kind: str) -> ModuleType:
    return importlib.import_module(REGISTRIES[kind])


def _entries() -> list[object]:
    return [pytest.param(kind, name, id=f"{kind}-{name}") for kind in REGISTRIES for name in _registry(kind).names()]


@pytest.mark.parametrize("kind", REGISTRIES)
def test_every_tier_exposes_the_same_names(kind: str) -> None:
    module = _registry(kind)
    assert isinstance(module.REGISTRY, PolicyRegistry) and module.REGISTRY.kind == kind
    assert module.names() == module.REGISTRY.names() == list(module.REGISTRY)
    # The baselines are every policy but the learned one, in the registry's order.
    learned = [name for name in module.names() if name not in module.BASELINES]
    assert len(learned) == 1 and tuple(n for n in module.names() if n != learned[0]) == module.BASELINES
    with pytest.raises(UnknownPolicyError, match=rf"^unknown {kind} policy 'nope'; known: {module.names()[0]}, "):
        module.get_policy("nope")


@pytest.mark.parametrize(("kind", "name"), _entries())
def test_each_key_is_its_modules_name_constant_and_builds_that_policy(kind: str, name: str) -> None:
    registry = _registry(kind)
    module_name, constructor = split_target(registry.REGISTRY.target(name))
    assert constructor == "build" or constructor.startswith("build_")
    module = importlib.import_module(module_name)
    assert getattr(module, name_constant(constructor)) == name
    assert registry.get_policy(name).name == name


def test_reading_the_names_imports_no_policy_module() -> None:
    probe = ("import json, sys\n"
             f"for module in {list(REGISTRIES.values())!r}:\n"
             "    __import__(module, fromlist=['names']).names()\n"
             "print(json.dumps(sorted(m for m in sys.modules if m in ('numpy', 'torch', 'scipy')"
             " or m.endswith(('_policy', '.round_robin', '.fgd', '.best_fit')))))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_generic_registry_imports_on_construction_and_names_the_unknown() -> None:
    registry = PolicyRegistry("test", {"frac": "fractions:Fraction", "dec": "decimal:Decimal"})
    assert registry.names() == ["frac", "dec"] and "frac" in registry and "nope" not in registry
    assert registry.get("frac", numerator=3, denominator=6) == 0.5
    error = registry.error("nope")
    assert isinstance(error, KeyError) and str(error) == "unknown test policy 'nope'; known: frac, dec"
    with pytest.raises(UnknownPolicyError) as raised:
        registry.get("nope")
    assert (raised.value.kind, raised.value.name, raised.value.known) == ("test", "nope", ("frac", "dec"))


@pytest.mark.parametrize("target", ["fractions", "fractions:", ":build", "a.b:not-a-name"])
def test_a_malformed_entry_is_refused_when_the_registry_is_made(target: str) -> None:
    with pytest.raises(ValueError, match=r"package\.module:function"):
        PolicyRegistry("test", {"x": target})


def test_constructor_names_map_to_name_constants() -> None:
    assert name_constant("build") == "NAME" and name_constant("build_burst") == "BURST_NAME"
    with pytest.raises(ValueError):
        name_constant("new")
