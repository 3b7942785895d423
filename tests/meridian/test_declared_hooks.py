"""Optional policy hooks are declared, not probed (STYLE.md 11, issue 25 item 3).

A policy that implements an optional extension point (placement: ``prepare``, ``observe_unschedulable``,
``tie_break``, ``run_counts``; routing: ``score_batch``, ``refine``, ``fallbacks``; autoscaling:
``update_context``) inherits the matching ``runtime_checkable`` protocol from its base module, and the
framework, the routing pass and the benchmarks ask ``isinstance`` instead of ``getattr``/``hasattr``.
Checked on the source (AST), as ``test_architecture.py`` checks imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("regional_scheduler", "global_scheduler", "gnn", "meridian")

# The callers of the hooks: no reflection at all there.
HOOK_CALLERS = (
    "regional_scheduler/framework.py",
    "regional_scheduler/bench_placement.py",
    "regional_scheduler/policies/learned.py",
    "regional_scheduler/learned/imitation.py",
    "regional_scheduler/autoscaling/online.py",
    "regional_scheduler/autoscaling/shadow.py",
    "regional_scheduler/autoscaling/benchmark.py",
    "global_scheduler/routing_pass.py",
    "global_scheduler/routing/base.py",
    "global_scheduler/bench_routing.py",
)

# Anywhere in the packages: no getattr/hasattr that names one of these hooks or probes a policy object.
HOOK_NAMES = {"prepare", "observe_unschedulable", "tie_break", "run_counts", "over_budget", "scorer",
              "score_batch", "refine", "fallbacks", "update_context"}


def reflection_calls(source: str, filename: str = "<source>") -> list[tuple[int, str, str, str | None]]:
    """``(line, function, first argument's source, attribute name if a literal)`` for each getattr/hasattr."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2):
            name = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
            found.append((node.lineno, node.func.id, ast.unparse(node.args[0]), name))
    return found


def probes(source: str, filename: str = "<source>") -> list[str]:
    """The reflection calls that probe a policy hook: a hook's name, or a policy object as the target."""
    return [f"{filename}:{line} {fn}({target}, {name!r})" for line, fn, target, name in reflection_calls(source, filename)
            if name in HOOK_NAMES or "policy" in target.lower()]


@pytest.mark.parametrize("path", HOOK_CALLERS)
def test_hook_callers_use_no_reflection(path: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"{path} moved: update HOOK_CALLERS"
    calls = reflection_calls(file.read_text(), path)
    assert calls == [], f"{path} calls getattr/hasattr (declare a protocol and use isinstance): {calls}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_policy_hook_is_probed(package: str) -> None:
    found = []
    for file in sorted((ROOT / package).rglob("*.py")):
        if file.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        found += probes(file.read_text(), str(file.relative_to(ROOT)))
    assert found == []


@pytest.mark.parametrize("source, expected", [
    pytest.param('x = getattr(self.policy, "prepare", None)\n', 1, id="getattr-policy"),
    pytest.param('if hasattr(router.policy, "fallbacks"): pass\n', 1, id="hasattr-policy"),
    pytest.param('f = getattr(obj, "update_context", None)\n', 1, id="hook-name"),
    pytest.param('v = getattr(table, column)\n', 0, id="column-reflection"),
])
def test_the_checker_sees_a_probe(source: str, expected: int) -> None:
    assert len(probes(source)) == expected


def _declares(obj: object, hook: str, protocol: type) -> bool:
    """True when ``obj`` has no ``hook``, or has it and inherits ``protocol`` explicitly."""
    return not hasattr(obj, hook) or protocol in type(obj).__mro__


def test_placement_policies_declare_their_hooks() -> None:
    from regional_scheduler.framework import Scheduler
    from regional_scheduler.policies import base
    from regional_scheduler.policies.learned import LearnedPolicy, ShadowPolicy
    from regional_scheduler.policies.registry import BASELINES, get_policy

    hooks = {"prepare": base.WorkloadAware, "observe_unschedulable": base.ObservesUnschedulable,
             "tie_break": base.ChoosesTieBreak, "run_counts": base.ReportsRunCounts}
    learned = LearnedPolicy()  # no checkpoint needed: it falls back to FGD
    policies = [get_policy(name) for name in BASELINES] + [learned, ShadowPolicy(get_policy("fgd"), learned)]
    for policy in policies:
        for hook, protocol in hooks.items():
            assert _declares(policy, hook, protocol), f"{type(policy).__name__} has {hook} but not {protocol.__name__}"
    assert Scheduler(get_policy("random")).random_ties and not Scheduler(get_policy("best-fit")).random_ties


def test_routing_policies_declare_their_hooks() -> None:
    from global_scheduler.routing import base
    from global_scheduler.routing.registry import get_policy, names

    hooks = {"score_batch": base.ScoresInBatch, "refine": base.RefinesScores, "fallbacks": base.CountsFallbacks}
    for name in names():
        policy = get_policy(name)
        for hook, protocol in hooks.items():
            assert _declares(policy, hook, protocol), f"{name} has {hook} but not {protocol.__name__}"
    gnn = base.Router(get_policy("gnn"))
    assert gnn.batch_scorer is gnn.policy
    assert base.Router(get_policy("least-carbon")).batch_scorer is None


def test_autoscaling_policies_declare_their_hooks() -> None:
    from regional_scheduler.autoscaling.policies.base import FollowsContext
    from regional_scheduler.autoscaling.policies.registry import REGISTRY, get_policy
    from regional_scheduler.autoscaling.shadow import ShadowRunner

    policies = [get_policy(name) for name in REGISTRY]
    policies.append(ShadowRunner(policies[0], policies[1]))
    for policy in policies:
        assert _declares(policy, "update_context", FollowsContext), type(policy).__name__
