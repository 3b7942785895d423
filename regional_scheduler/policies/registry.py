"""Name → constructor for every placement policy (kube-scheduler's ``registry.go``).

The three policy registries — placement (this one), routing (``global_scheduler.routing.registry``)
and autoscaling (``regional_scheduler.autoscaling.policies.registry``) — share one scheme, the core's
:class:`meridian.policy_registry.PolicyRegistry`: ``REGISTRY`` maps each policy's name to
``"package.module:build"``, a string, so reading the names (``meridian --help``, ``--policies``
validation) imports no policy module, no numpy and no torch; the module is imported on the first
construction. Every policy module's constructor is ``build`` (a variant's ``build_<variant>``) and
every key is the module's name constant (``NAME``, a variant's ``<VARIANT>_NAME``); each tier's test
checks both. Each registry module exposes the same three names: ``names()``, ``get_policy(name,
**kwargs)`` (an unknown name raises :class:`UnknownPolicyError`, a ``KeyError`` listing the known
ones) and ``BASELINES`` (every policy but the learned one). No registration by import side effect:
the table is the whole list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meridian.policy_registry import PolicyRegistry, UnknownPolicyError

if TYPE_CHECKING:
    from regional_scheduler.policies.base import ScorePolicy

__all__ = ["BASELINES", "REGISTRY", "UnknownPolicyError", "get_policy", "names"]

LEARNED = "learned"
REGISTRY: PolicyRegistry[ScorePolicy] = PolicyRegistry("placement", {
    "random": "regional_scheduler.policies.random_fit:build",
    "least-allocated": "regional_scheduler.policies.resource_allocation:build_least",
    "most-allocated": "regional_scheduler.policies.resource_allocation:build_most",
    "balanced": "regional_scheduler.policies.resource_allocation:build_balanced",
    "requested-to-capacity": "regional_scheduler.policies.resource_allocation:build_rtcr",
    "best-fit": "regional_scheduler.policies.best_fit:build",
    "dot-product": "regional_scheduler.policies.dot_product:build",
    "gpu-packing": "regional_scheduler.policies.gpu_packing:build",
    "gpu-clustering": "regional_scheduler.policies.gpu_clustering:build",
    "fgd": "regional_scheduler.policies.fgd:build",
    "learned": "regional_scheduler.policies.learned:build",  # torch and a checkpoint
}, learned=LEARNED)

BASELINES: tuple[str, ...] = REGISTRY.baselines
names = REGISTRY.names
get_policy = REGISTRY.get
