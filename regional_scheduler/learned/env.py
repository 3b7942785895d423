"""A Gymnasium environment over the simulator: one step places one pod.

Observation (a dict, fixed width ``n`` = number of nodes):

- ``node_features (n, N_NODE)``: :mod:`~regional_scheduler.learned.features` for every feasible
  node, zeros elsewhere;
- ``pod_features (N_POD,)``: the pod's request and cluster-wide allocation;
- ``action_mask (n,)``: the hard-constraint filter's verdict (:func:`regional_scheduler.filters.run_filters`).

``info`` also carries ``base_scores`` (FGD's own node scores of the candidates, the residual
policy's base) and ``features_of(idx)`` (the features of candidates ``idx``). With
``lazy_features=True`` (training rollouts of the residual policy, which reads only FGD's near-best
nodes) features are built only when ``features_of`` asks, and ``node_features`` stays zero.

Action: a node index. A masked (infeasible) action is refused with an error — the policy must read the
mask, exactly as the scheduler never shows it an infeasible node. A pod that fits nowhere is
recorded as unplaced (``−unplaced_penalty``) without asking the agent, and the episode moves on.

Reward: :mod:`~regional_scheduler.learned.reward` (layered per-step terms, a terminal allocation
term). An episode ends after the last pod, or — with ``stop_at_arrived_pct`` — once the arrived
GPU request reaches that share of cluster GPU capacity (the openb benchmark reads 100 %).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from meridian import metrics
from meridian.cluster_state import ClusterState, Placement
from meridian.model import Node, Pod
from meridian.simulator import seed_cluster, seed_pods
from meridian.traces import openb
from regional_scheduler.filters import run_filters
from regional_scheduler.learned import reward as rw
from regional_scheduler.learned.features import N_NODE, N_POD, FeatureBuilder


@dataclass(frozen=True)
class Episode:
    """One placement episode: a cluster, the arriving pods in order, and the target workload."""

    nodes: list[Node]
    arrivals: list[Pod]
    workload: list[Pod]
    stop_at_arrived_pct: float | None = None


def openb_episode(pod_list: Sequence[Pod], all_nodes: Sequence[Node], seed: int, *, node_fraction: float = 1.0,
                  ratio: float = 1.3, stop_at_arrived_pct: float | None = 100.0) -> Episode:
    """The openb protocol, optionally on a random ``node_fraction`` of the nodes (cheaper training
    episodes with the same mix of node types; the pod list is inflated to that cluster's capacity)."""
    rng = np.random.default_rng(seed)
    nodes = list(all_nodes)
    if node_fraction < 1.0:
        keep = np.sort(rng.choice(len(nodes), size=max(1, round(node_fraction * len(nodes))), replace=False))
        nodes = [nodes[i] for i in keep]
    cap = sum(n.allocatable_resources.gpu for n in nodes) * 1000
    if node_fraction < 1.0:
        # Sub-sample the pod list in proportion too, so the inflation resamples as the full run does.
        pods = [pod_list[i] for i in np.sort(rng.choice(len(pod_list), size=max(1, int(len(pod_list) * node_fraction)),
                                                        replace=False))]
    else:
        pods = list(pod_list)
    arrivals = openb.inflate_pods(pods, cap, ratio=ratio, seed=seed)
    return Episode(nodes, arrivals, list(pod_list), stop_at_arrived_pct)


def seed_episode(seed: int) -> Episode:
    pods = seed_pods(seed)
    return Episode(seed_cluster(), pods, pods, None)


class PlacementEnv(gym.Env):
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, episode: Episode, *, reward: rw.RewardConfig | None = None, lazy_features: bool = False) -> None:
        self.episode = episode
        self.lazy_features = lazy_features
        n = len(episode.nodes)
        self.observation_space = spaces.Dict({
            "node_features": spaces.Box(-np.inf, np.inf, shape=(n, N_NODE), dtype=np.float32),
            "pod_features": spaces.Box(-np.inf, np.inf, shape=(N_POD,), dtype=np.float32),
            "action_mask": spaces.MultiBinary(n),
        })
        self.action_space = spaces.Discrete(n)
        self._reward_override = reward
        self.features = FeatureBuilder()
        self.state: ClusterState | None = None

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.state = ClusterState.from_nodes(self.episode.nodes)
        self.features.prepare(self.state, self.episode.workload)
        self.reward_cfg = self._reward_override or rw.default_reward(self.state)
        self.gpu_cap = metrics.gpu_capacity_milli(self.state)
        self.cursor = 0
        self.arrived_gpu_milli = 0
        self.n_arrived = 0
        self.n_failed = 0
        self.done = False
        self._pending = 0.0
        self._advance()
        return self._observation(), self._info()

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        if self.done or self.state is None:
            raise RuntimeError("step() on a finished episode; call reset()")
        action = int(action)
        if not (0 <= action < self.state.n_nodes) or not self.mask[action]:
            raise ValueError(f"action {action} is masked: node infeasible for pod {self.pod.name}")
        k = int(np.searchsorted(self.candidates, action))
        device = int(self.devices[k])
        pod = self.pod
        if device >= 0 and pod.requests.gpu_milli:
            placement = Placement(action, (device,), pod.requests.gpu_milli)
        else:
            placement = self.state.choose_devices(action, pod)
        self.state.allocate(pod, placement)
        reward = self._pending + rw.step_reward(self.reward_cfg, self.state, action,
                                                gpu_frag_milli=self._gpu_frag())
        self._pending = 0.0
        self._arrive(pod)
        self.cursor += 1
        self._advance()
        if self.done:
            reward += self._pending + rw.terminal_reward(self.reward_cfg, self.state, gpu_frag_milli=self._gpu_frag())
            self._pending = 0.0
        return self._observation(), float(reward), self.done, False, self._info()

    # ------------------------------------------------------------------ internals
    def _gpu_frag(self) -> float | None:
        if not self.gpu_cap:
            return None
        assert self.state is not None
        return float(self.features.fgd.node_fragmentation(self.state).sum())

    def _arrive(self, pod: Pod) -> None:
        self.n_arrived += 1
        self.arrived_gpu_milli += pod.requests.gpu_milli_total

    def _stopped(self) -> bool:
        stop = self.episode.stop_at_arrived_pct
        if self.cursor >= len(self.episode.arrivals):
            return True
        return bool(stop is not None and self.gpu_cap and self.arrived_gpu_milli * 100 >= stop * self.gpu_cap)

    def _advance(self) -> None:
        """Move to the next pod with a feasible node, recording the ones that fit nowhere."""
        assert self.state is not None
        while not self._stopped():
            pod = self.episode.arrivals[self.cursor]
            mask, _ = run_filters(self.state, pod)
            if mask.any():
                self.pod, self.mask = pod, mask
                self.candidates = np.flatnonzero(mask)
                base = self.features.fgd.score(self.state, pod, self.candidates)
                self.base_scores, self.devices = base.scores, base.devices
                if self.lazy_features:
                    self.candidate_features = np.zeros((0, N_NODE), dtype=np.float32)
                else:
                    self.candidate_features, _ = self.features.node_features(self.state, pod, self.candidates)
                self.pod_features = self.features.pod_features(self.state, pod, self.candidates.size)
                return
            self.n_failed += 1
            self._pending -= self.reward_cfg.unplaced_penalty
            self._arrive(pod)
            self.cursor += 1
        self.done = True
        self.mask = np.zeros(self.state.n_nodes, dtype=bool)
        self.candidates = np.zeros(0, dtype=np.int64)
        self.base_scores = np.zeros(0)
        self.candidate_features = np.zeros((0, N_NODE), dtype=np.float32)
        self.pod_features = np.zeros(N_POD, dtype=np.float32)

    def _observation(self) -> dict[str, np.ndarray]:
        assert self.state is not None
        full = np.zeros((self.state.n_nodes, N_NODE), dtype=np.float32)
        if not self.lazy_features:
            full[self.candidates] = self.candidate_features
        return {"node_features": full, "pod_features": self.pod_features, "action_mask": self.mask.copy()}

    def _features_of(self, idx: np.ndarray, columns: np.ndarray | None = None) -> np.ndarray:
        """Features of candidates ``idx`` (positions in ``candidates``); with ``lazy_features``, only
        ``columns`` (the others 0) when given."""
        if not self.lazy_features:
            return self.candidate_features[idx]
        assert self.state is not None
        return self.features.node_features(self.state, self.pod, self.candidates[idx], columns)[0]

    def _info(self) -> dict[str, Any]:
        assert self.state is not None
        return {
            "candidates": self.candidates,
            "candidate_features": self.candidate_features,
            "base_scores": self.base_scores,
            "features_of": self._features_of,
            "n_arrived": self.n_arrived,
            "n_failed": self.n_failed,
            "allocation": rw.allocation(self.state),
        }
