"""The seed analysis' layered placement reward, plus an unplaced-pod penalty and a terminal term.

Per step (one pod), after the placement:

    r = scale · ( w_frag · (−frag) + w_bal · balance + w_spread · spread + w_util · band(util) )
        − unplaced_penalty · [pod could not be placed]

- ``frag`` ∈ [0, 1]: the cluster's fragmentation — on a GPU cluster the FGD fragmentation as a
  share of cluster GPUs (what FGD minimises), on a CPU-only cluster the seed score (mean Gini of
  free CPU and free memory) / 100;
- ``balance`` ∈ [0, 1]: ``1 − |cpu_frac − mem_frac|`` of the chosen node after placement
  (kube-scheduler's BalancedAllocation idea);
- ``spread`` ∈ [0, 1]: ``1 − 2·std`` of node utilisation (clipped at 0) — rewards an even spread;
- ``band(util)`` ∈ [0, 1]: 1 while the cluster's allocation (GPU on a GPU cluster, CPU otherwise)
  is inside the 80–95 % band, falling linearly to 0 at 0 % below and at 100 % above.

At the end of an episode: ``+ terminal_allocation · alloc − terminal_fragmentation · frag
− fragmentation_over_cap · max(0, frag − fragmentation_cap)``, with ``alloc`` the final allocation
ratio (the benchmark's headline number) in [0, 1]. The cap term turns a fragmentation *target*
(seed-50x200: Gini ≤ 31) into a constraint: with a small ``terminal_fragmentation`` and a large
``unplaced_penalty`` the return is dominated by failures, and fragmentation costs little until it
passes the cap, then much (off by default: ``fragmentation_cap`` 1).

The four layered weights must sum to 1 (the seed's convention); :class:`RewardConfig` validates it.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field, model_validator

from meridian import metrics
from meridian.cluster_state import ClusterState

UTIL_BAND = (0.80, 0.95)


class RewardConfig(BaseModel):
    """Weights of the layered reward. ``fragmentation + balance + spreading + utilisation`` = 1."""

    fragmentation: float = Field(0.4, ge=0, description="weight of the fragmentation penalty")
    balance: float = Field(0.2, ge=0, description="weight of the chosen node's CPU/memory balance")
    spreading: float = Field(0.2, ge=0, description="weight of the even spread of node utilisation")
    utilisation: float = Field(0.2, ge=0, description="weight of the 80–95 % utilisation band")
    layered_scale: float = Field(1.0, ge=0, description="scale of the per-step layered sum")
    unplaced_penalty: float = Field(1.0, ge=0, description="subtracted for each pod that fits nowhere")
    terminal_allocation: float = Field(0.0, ge=0, description="× final allocation ratio (0–1) at the end")
    terminal_fragmentation: float = Field(0.0, ge=0, description="× final fragmentation (0–1) at the end")
    fragmentation_cap: float = Field(1.0, ge=0, le=1, description="final fragmentation (0–1) above which "
                                     "fragmentation_over_cap applies")
    fragmentation_over_cap: float = Field(0.0, ge=0, description="× (final fragmentation − fragmentation_cap)⁺ "
                                          "at the end")

    @model_validator(mode="after")
    def _weights_sum_to_one(self) -> RewardConfig:
        total = self.fragmentation + self.balance + self.spreading + self.utilisation
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"layered reward weights must sum to 1 (fragmentation + balance + spreading + "
                             f"utilisation = {total:g})")
        return self


# GPU clusters (openb): the benchmark judges the allocation at 100 % arrived, so the terminal term
# dominates; the layered terms are kept small as shaping.
GPU_REWARD = RewardConfig(layered_scale=0.001, unplaced_penalty=0.0, terminal_allocation=100.0)
# CPU-only clusters (seed-50x200): judged on failures, fragmentation (Gini) and CPU allocation.
# Terminal weights: one point of CPU allocation = 0.5, one point of the Gini score = 1, one unplaced
# pod (0.5 % failure on 200 pods) = 1.5. Single development runs with 0.5 / 1 / 2 per pod ended at
# 3.3 / 3.05 / 2.1 % failure and Gini 21 / 23 / 44 on the benchmark seeds; 1.5 aims under 3 %.
CPU_REWARD = RewardConfig(fragmentation=0.5, balance=0.1, spreading=0.2, utilisation=0.2, layered_scale=0.01,
                          unplaced_penalty=1.5, terminal_allocation=50.0, terminal_fragmentation=100.0)


def band(util: float, lo: float = UTIL_BAND[0], hi: float = UTIL_BAND[1]) -> float:
    if util < lo:
        return max(0.0, util / lo)
    if util > hi:
        return max(0.0, (1.0 - util) / (1.0 - hi))
    return 1.0


def has_gpus(state: ClusterState) -> bool:
    return int(state.gpu_count.sum()) > 0


def allocation(state: ClusterState) -> float:
    """The headline allocation ratio in [0, 1]: GPU on a GPU cluster, CPU otherwise."""
    if has_gpus(state):
        return (metrics.gpu_alloc_pct(state) or 0.0) / 100.0
    return metrics.cpu_alloc_pct(state) / 100.0


def fragmentation(state: ClusterState, gpu_frag_milli: float | None = None) -> float:
    """Cluster fragmentation in [0, 1]; ``gpu_frag_milli``: the FGD fragmentation sum if known."""
    if has_gpus(state) and gpu_frag_milli is not None:
        return float(gpu_frag_milli) / metrics.gpu_capacity_milli(state)
    return metrics.seed_fragmentation_score(state) / 100.0


def step_reward(cfg: RewardConfig, state: ClusterState, node: int | None, *, gpu_frag_milli: float | None = None) -> float:
    if node is None:
        return -cfg.unplaced_penalty
    if cfg.layered_scale == 0.0:
        return 0.0
    cpu = state.req_milli_cpu / np.maximum(state.alloc_milli_cpu, 1)
    mem = state.req_memory_bytes / np.maximum(state.alloc_memory_bytes, 1)
    balance = 1.0 - abs(float(cpu[node]) - float(mem[node]))
    spread = max(0.0, 1.0 - 2.0 * float(np.std((cpu + mem) / 2.0)))
    layered = (-cfg.fragmentation * fragmentation(state, gpu_frag_milli) + cfg.balance * balance
               + cfg.spreading * spread + cfg.utilisation * band(allocation(state)))
    return cfg.layered_scale * layered


def terminal_reward(cfg: RewardConfig, state: ClusterState, *, gpu_frag_milli: float | None = None) -> float:
    frag = fragmentation(state, gpu_frag_milli)
    return (cfg.terminal_allocation * allocation(state) - cfg.terminal_fragmentation * frag
            - cfg.fragmentation_over_cap * max(0.0, frag - cfg.fragmentation_cap))


def default_reward(state: ClusterState) -> RewardConfig:
    return GPU_REWARD if has_gpus(state) else CPU_REWARD
