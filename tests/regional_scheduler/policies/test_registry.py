"""The placement registry (the scheme all three share: tests/meridian/test_policy_registries.py)."""

from __future__ import annotations

import pytest

from regional_scheduler.policies.registry import (
    BASELINES,
    REGISTRY,
    UnknownPolicyError,
    get_policy,
    names,
)


def test_learned_is_the_only_non_baseline_and_stays_lazy() -> None:
    assert set(names()) - set(BASELINES) == {"learned"}
    assert REGISTRY.target("learned") == "regional_scheduler.policies.learned:build"


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError, match="known: random, least-allocated"):
        get_policy("nope")


def test_the_error_names_the_kind_and_the_known_policies() -> None:
    error = REGISTRY.error("nope")
    assert isinstance(error, UnknownPolicyError) and isinstance(error, KeyError)
    assert str(error) == f"unknown placement policy 'nope'; known: {', '.join(names())}"


def test_resource_allocation_variants_take_their_arguments() -> None:
    spreading = get_policy("requested-to-capacity", shape=[(0, 10), (100, 0)])
    assert spreading.name == "requested-to-capacity"
