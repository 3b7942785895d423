"""One place to seed every source of randomness (Stable-Baselines3's ``set_random_seed``).

Every training loop and benchmark of every tier seeds through this function: the placement policy's
training (``regional_scheduler.learned``), the autoscaling agents (``regional_scheduler.autoscaling``)
and the routing network's training (``global_scheduler.routing_training``, ``gnn``).
"""

from __future__ import annotations

import random

import numpy as np


def set_random_seed(seed: int) -> np.random.Generator:
    """Seed Python's ``random``, numpy's global generator and torch; return a numpy Generator from the
    same seed (for an environment that keeps its own).

    numpy's global generator takes ``seed mod 2**32`` (it accepts no larger seed); the others take it as given.
    torch is imported here, not at the top, so the core does not load it for a caller that never seeds."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)
