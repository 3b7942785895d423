"""A fixed-size circular replay buffer of typed transitions."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class ReplaySamples(NamedTuple):
    states: torch.Tensor  # [batch, n_features] float32
    actions: torch.Tensor  # [batch] int64
    rewards: torch.Tensor  # [batch] float32
    next_states: torch.Tensor  # [batch, n_features] float32
    dones: torch.Tensor  # [batch] float32: 1 where the episode *terminated* (not truncated)


class ReplayBuffer:
    def __init__(self, capacity: int, n_features: int) -> None:
        self.capacity = capacity
        self.states = np.zeros((capacity, n_features), dtype=np.float32)
        self.next_states = np.zeros((capacity, n_features), dtype=np.float32)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.position = 0
        self.size = 0

    def add(self, state: np.ndarray, action: int, reward: float, next_state: np.ndarray, done: bool) -> None:
        i = self.position
        self.states[i], self.actions[i], self.rewards[i] = state, action, reward
        self.next_states[i], self.dones[i] = next_state, float(done)
        self.position = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> ReplaySamples:
        idx = rng.integers(0, self.size, size=batch_size)
        return ReplaySamples(torch.from_numpy(self.states[idx]), torch.from_numpy(self.actions[idx]),
                             torch.from_numpy(self.rewards[idx]), torch.from_numpy(self.next_states[idx]),
                             torch.from_numpy(self.dones[idx]))
