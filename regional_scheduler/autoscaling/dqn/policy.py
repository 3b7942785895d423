"""The Q-network: an MLP from the state vector to one Q-value per action."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


class QNetwork(nn.Module):
    """``Q(s, ·) = MLP(s)``; shapes ``[batch, n_features] → [batch, n_actions]``."""

    def __init__(self, n_features: int, n_actions: int, hidden: tuple[int, ...] = (64, 64)) -> None:
        super().__init__()
        self.n_features = n_features
        self.n_actions = n_actions
        self.hidden = tuple(hidden)
        layers: list[nn.Module] = []
        width = n_features
        for size in self.hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, n_actions))
        self.net = nn.Sequential(*layers)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.net:
            if isinstance(module, nn.Linear):
                module.reset_parameters()

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.net(states)

    @torch.no_grad()
    def predict(self, state: np.ndarray) -> int:
        """Greedy action for one state."""
        q = self.forward(torch.as_tensor(state, dtype=torch.float32).unsqueeze(0))
        return int(q.argmax(dim=1).item())

    def constructor_kwargs(self) -> dict[str, Any]:
        """What a checkpoint needs to rebuild this module."""
        return {"n_features": self.n_features, "n_actions": self.n_actions, "hidden": list(self.hidden)}
