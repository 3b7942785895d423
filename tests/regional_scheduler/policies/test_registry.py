"""The placement registry: names read without importing a policy, constructors import on first use."""

from __future__ import annotations

import importlib

import pytest

from regional_scheduler.policies.registry import (
    BASELINES,
    REGISTRY,
    LazyConstructor,
    UnknownPolicyError,
    get_policy,
)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in BASELINES])
def test_each_baseline_builds_the_policy_its_name_says(name: str) -> None:
    constructor = REGISTRY[name]
    assert isinstance(constructor, LazyConstructor)
    module = importlib.import_module(constructor.module)
    # A module with one policy names it in NAME; resource_allocation's four share a class and take the name.
    assert getattr(module, "NAME", name) == name
    assert get_policy(name).name == name


def test_learned_is_the_only_non_baseline_and_stays_lazy() -> None:
    assert set(REGISTRY) - set(BASELINES) == {"learned"}
    assert REGISTRY["learned"] == LazyConstructor("regional_scheduler.learned.serving", "new_learned_policy")


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError, match="known: random, least-allocated"):
        get_policy("nope")
