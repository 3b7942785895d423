"""``meridian.seeding.set_random_seed``: the one function that seeds every source of randomness."""

from __future__ import annotations

import random

import numpy as np
import torch

from meridian.seeding import set_random_seed


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_one_seed_repeats_random_numpy_and_torch() -> None:
    set_random_seed(7)
    first = _draws()
    set_random_seed(7)
    assert _draws() == first
    set_random_seed(8)
    assert _draws() != first


def test_returns_a_generator_of_the_same_seed() -> None:
    assert set_random_seed(3).integers(1 << 30) == np.random.default_rng(3).integers(1 << 30)


def test_a_seed_beyond_numpy_global_range_is_accepted() -> None:
    set_random_seed(2**32 + 5)
    a = float(np.random.random())
    set_random_seed(5)
    assert float(np.random.random()) == a  # numpy's global generator takes the seed mod 2**32
