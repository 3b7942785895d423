"""Typed samples for imitation learning (Stable-Baselines3 keeps buffers apart from the algorithm).

One :class:`ImitationSample` is one placement decision of the teacher: a subsample of the candidate
nodes (at most ``max_candidates``, always including every node the teacher ranked best), the pooled
context of *all* candidates (so the network sees the same context as at serving time), the pod's
features and which of the kept candidates the teacher ranked best (a set: heuristics tie).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from regional_scheduler.learned.features import N_NODE, N_POD


@dataclass(frozen=True)
class ImitationSample:
    node_features: np.ndarray  # float32 (k, N_NODE), k ≤ max_candidates
    pod_features: np.ndarray  # float32 (N_POD,)
    context: np.ndarray  # float32 (2·N_NODE,): [mean ‖ max] of all candidates' raw features
    teacher_best: np.ndarray  # bool (k,)


@dataclass(frozen=True)
class ImitationBatch:
    node_features: torch.Tensor  # (B, K, N_NODE)
    pod_features: torch.Tensor  # (B, N_POD)
    context: torch.Tensor  # (B, 2·N_NODE)
    valid: torch.Tensor  # bool (B, K)
    teacher_best: torch.Tensor  # bool (B, K)


class ImitationBuffer:
    def __init__(self, max_candidates: int = 64) -> None:
        self.max_candidates = max_candidates
        self.samples: list[ImitationSample] = []

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, sample: ImitationSample) -> None:
        if sample.node_features.shape[0] > self.max_candidates:
            raise ValueError(f"sample has {sample.node_features.shape[0]} candidates; max {self.max_candidates}")
        self.samples.append(sample)

    def feature_statistics(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of every node feature over all stored candidates (std of a
        constant feature is 1, so it passes through unscaled)."""
        rows = np.concatenate([s.node_features for s in self.samples]) if self.samples else np.zeros((1, N_NODE))
        mean = rows.mean(axis=0)
        std = rows.std(axis=0)
        return mean.astype(np.float32), np.where(std > 1e-6, std, 1.0).astype(np.float32)

    def batch(self, indices: np.ndarray) -> ImitationBatch:
        b, k = len(indices), self.max_candidates
        x = np.zeros((b, k, N_NODE), dtype=np.float32)
        pod = np.zeros((b, N_POD), dtype=np.float32)
        ctx = np.zeros((b, 2 * N_NODE), dtype=np.float32)
        valid = np.zeros((b, k), dtype=bool)
        best = np.zeros((b, k), dtype=bool)
        for row, i in enumerate(indices):
            s = self.samples[int(i)]
            n = s.node_features.shape[0]
            x[row, :n] = s.node_features
            pod[row] = s.pod_features
            ctx[row] = s.context
            valid[row, :n] = True
            best[row, :n] = s.teacher_best
        return ImitationBatch(torch.from_numpy(x), torch.from_numpy(pod), torch.from_numpy(ctx),
                              torch.from_numpy(valid), torch.from_numpy(best))
