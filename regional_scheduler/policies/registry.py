"""Name → constructor for every placement policy (kube-scheduler's ``registry.go``).

No registration by import side effect: this table is the whole list, and the CLI's
``--policies`` reads it. Each entry names the policy's module and constructor and imports the
module on the first construction, so reading the names (``meridian --help``, option validation)
costs no numpy, no cluster state and no torch. ``learned`` is constructed by the regional
scheduler's serving code (it needs a checkpoint and torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regional_scheduler.policies.base import ScorePolicy


@dataclass(frozen=True)
class LazyConstructor:
    """A policy constructor imported when it is first called: ``module.attribute()``."""

    module: str
    attribute: str

    def __call__(self) -> ScorePolicy:
        return getattr(importlib.import_module(self.module), self.attribute)()


def _policy(module: str, attribute: str = "new") -> LazyConstructor:
    return LazyConstructor(f"regional_scheduler.policies.{module}", attribute)


# Keys are the modules' ``NAME`` (tests/regional_scheduler/policies/test_registry.py checks them).
REGISTRY: dict[str, Callable[[], ScorePolicy]] = {
    "random": _policy("random_fit"),
    "least-allocated": _policy("resource_allocation", "least"),
    "most-allocated": _policy("resource_allocation", "most"),
    "balanced": _policy("resource_allocation", "balanced"),
    "requested-to-capacity": _policy("resource_allocation", "rtcr"),
    "best-fit": _policy("best_fit"),
    "dot-product": _policy("dot_product"),
    "gpu-packing": _policy("gpu_packing"),
    "gpu-clustering": _policy("gpu_clustering"),
    "fgd": _policy("fgd"),
    "learned": LazyConstructor("regional_scheduler.learned.serving", "new_learned_policy"),
}

BASELINES: tuple[str, ...] = tuple(name for name in REGISTRY if name != "learned")


class UnknownPolicyError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown placement policy {name!r}; known: {', '.join(REGISTRY)}")


def get_policy(name: str) -> ScorePolicy:
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(name) from None
    return factory()
