"""One place to seed every source of randomness (SB3's ``set_random_seed``)."""

from __future__ import annotations

import random

import numpy as np
import torch


def set_random_seed(seed: int) -> np.random.Generator:
    """Seed ``random``, numpy's global state and torch; return a numpy Generator for the environment."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)
