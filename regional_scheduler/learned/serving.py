"""The learned placement model as served: checkpoint settings and the scorer behind the ``learned`` policy.

The policy itself (fallback, time budget, shadow mode) is the plugin
:mod:`regional_scheduler.policies.learned`; this module is the model it serves:

- **Residual over FGD.** The model re-ranks only FGD's near-best nodes
  (:func:`~regional_scheduler.learned.policy.residual_logits`); features are built for those nodes
  only, which is what keeps a decision well under a millisecond.
- **Profiles.** A checkpoint holds one network per cluster kind: ``gpu`` for clusters with GPUs,
  ``cpu`` for CPU-only clusters (the seed analysis' 50×200 setting). The profile is chosen from the
  cluster, never from the benchmark's name.
- **Gate.** A profile with ``gate_share`` leaves the workload to FGD while the share of its GPU pods
  that carry a GPU-model constraint is at least ``gate_share``: the share of FGD's window of recent
  pods in a live scheduler, the workload's distribution when a benchmark states it (``--paper``).
  Nothing here needs a pod that has not arrived.

The hot path is numpy (:class:`~regional_scheduler.learned.numpy_policy.NumpyPlacementNet`), one pass over
all candidate nodes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT
from regional_scheduler.learned.features import FeatureBuilder
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.policies.base import Scores, WorkloadAware


class ServingSettings(BaseModel):
    """How the learned policy is served (environment: ``MERIDIAN_LEARNED_*``)."""

    checkpoint: Path = Field(DEFAULT_CHECKPOINT, description="checkpoint file; the committed one by default")
    budget_ms: float = Field(5.0, gt=0, description="a decision slower than this (ms) is replaced by the "
                             "fallback's; 5 ms is 5× the p99 target, so only a stalled model trips it")
    enforce_budget: bool = Field(True, description="replace over-budget decisions by FGD's (serving); when off "
                                 "(benchmarks) they are only counted, so results do not depend on machine load")

    @classmethod
    def from_env(cls) -> ServingSettings:
        values: dict[str, object] = {}
        if path := os.environ.get("MERIDIAN_LEARNED_CHECKPOINT"):
            values["checkpoint"] = Path(path)
        if budget := os.environ.get("MERIDIAN_LEARNED_BUDGET_MS"):
            values["budget_ms"] = float(budget)
        if (enforce := os.environ.get("MERIDIAN_LEARNED_ENFORCE_BUDGET")) is not None:
            values["enforce_budget"] = enforce.strip().lower() not in ("0", "false", "no", "off")
        return cls(**values)


def cluster_profile(state: ClusterState) -> str:
    return "gpu" if int(state.gpu_count.sum()) > 0 else "cpu"


class LearnedScorer(WorkloadAware):
    """FGD's scores → the network's bounded correction on the near-best nodes → one score per
    candidate node; FGD's device rule for shared-GPU pods."""

    def __init__(self, nets: dict[str, PlacementNet]) -> None:
        self.nets = nets
        self.fast = {name: NumpyPlacementNet(net) for name, net in nets.items()}
        self.features = FeatureBuilder()
        self.profile = next(iter(nets))
        self._profiled_state: ClusterState | None = None

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        """The workload's distribution, as the FGD paper's protocol states it (``bench placement --paper``);
        a live scheduler is never prepared."""
        self.features.prepare(state, workload)
        self._choose_profile(state)

    @property
    def left_to_fgd(self) -> bool:
        """True while FGD places every pod: the profile's gate is on."""
        return self.gated

    @property
    def constrained_share(self) -> float:
        """The workload's share of model-constrained GPU pods: the target workload's once prepared,
        else FGD's window's (:meth:`FeatureBuilder.follow_window`)."""
        return self.features.constrained_share

    @property
    def gated(self) -> bool:
        """True while the workload is left to FGD: its constrained share is ≥ the profile's ``gate_share``."""
        gate = self.fast[self.profile].gate_share
        return gate is not None and self.constrained_share >= gate

    def _choose_profile(self, state: ClusterState) -> None:
        wanted = cluster_profile(state)
        self.profile = wanted if wanted in self.nets else next(iter(self.nets))
        self._profiled_state = state

    @property
    def net(self) -> PlacementNet:
        return self.nets[self.profile]

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        if state is not self._profiled_state:  # a live scheduler is never prepared
            self._choose_profile(state)
        base, delta = self.features.fgd.score_with_delta(state, pod, nodes)
        self.features.follow_window(state)
        if self.left_to_fgd:
            return base
        p = self.features.pod_features(state, pod, nodes.size)
        # FGD's deltas of the candidates are a feature: handed over rather than looked up again.
        scores = self.fast[self.profile].residual_columns(
            base.scores, lambda idx, cols: self.features.node_features(
                state, pod, nodes[idx], cols, fgd_delta=(delta[idx], base.devices[idx]))[0], p,
            unused=lambda idx: self.features.unused(state, nodes[idx]))
        return Scores(scores, base.devices)
