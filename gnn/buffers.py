"""Typed training samples for the routing policy: one decision = one graph and a target distribution."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch_geometric.data import Batch, Data


@dataclass
class DecisionSample:
    """One routing decision: the graph the policy saw and the teacher's distribution over its choices.

    ``target`` and ``mask`` have ``n + 1`` entries (clusters, then "defer"); masked-out choices have
    target 0 and are excluded from the softmax.
    """

    graph: Data
    target: np.ndarray  # float32 (n + 1,)
    mask: np.ndarray  # bool (n + 1,)


class DecisionBuffer:
    """A bounded list of samples (oldest dropped first) with seeded mini-batches."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self.samples: list[DecisionSample] = []

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, sample: DecisionSample) -> None:
        self.samples.append(sample)
        if len(self.samples) > self.capacity:
            del self.samples[: len(self.samples) - self.capacity]

    def batches(self, batch_size: int, rng: np.random.Generator):
        order = rng.permutation(len(self.samples))
        for start in range(0, len(order), batch_size):
            chunk = [self.samples[i] for i in order[start:start + batch_size]]
            yield collate(chunk)


def collate(samples: list[DecisionSample]) -> tuple[Batch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A PyG batch plus dense (B, n_max + 1) targets and masks and the (B,) cluster counts."""
    batch = Batch.from_data_list([s.graph for s in samples])
    n_max = max(len(s.target) for s in samples)
    target = np.zeros((len(samples), n_max), dtype=np.float32)
    mask = np.zeros((len(samples), n_max), dtype=bool)
    counts = np.zeros(len(samples), dtype=np.int64)
    for i, s in enumerate(samples):
        n = len(s.target) - 1
        counts[i] = n
        target[i, :n] = s.target[:n]
        mask[i, :n] = s.mask[:n]
        target[i, n_max - 1] = s.target[n]  # "defer" is always the last column
        mask[i, n_max - 1] = s.mask[n]
    return batch, torch.from_numpy(target), torch.from_numpy(mask), torch.from_numpy(counts)
