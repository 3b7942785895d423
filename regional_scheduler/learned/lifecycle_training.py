"""Short, deterministic training of the placement correction for continual learning.

A retrain is a short evolution-strategies policy search
(:class:`~regional_scheduler.learned.algorithm.EvolutionStrategy`) over the linear correction's head
weights (:data:`~regional_scheduler.learned.algorithm.CORRECTION_FEATURES`) on replays of recent
windows, started from FGD itself (``g ≡ 0``, :func:`restarted`). Imitation is skipped: FGD is the
residual policy's base already. The fitness is the window's own outcome —
unschedulable pods, then GPU fragmentation — so the search optimises what the promotion gate judges.
A fixed number of generations (not a wall-time cap) keeps the result the same for a seed on any
machine.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from meridian.seeding import set_random_seed
from regional_scheduler.learned.algorithm import CORRECTION_FEATURES, EvolutionStrategy, search_mask
from regional_scheduler.learned.checkpoint import load_checkpoint, save_checkpoint
from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT
from regional_scheduler.learned.env import Episode
from regional_scheduler.learned.features import IDX
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.learned.reward import RewardConfig

PROFILE = "gpu"
# One unschedulable pod costs 1; the whole GPU capacity fragmented costs 5 (a window's fragmentation is
# 0.04–0.09, so it breaks ties between equal failure counts and never outweighs a pod). The layered
# per-step terms are kept as faint shaping, as in GPU_REWARD.
WINDOW_REWARD = RewardConfig(layered_scale=0.001, unplaced_penalty=1.0, terminal_fragmentation=5.0)
# The correction may move a pod up to 2.5 FGD score points (FGD's integer scores, 0–100): far enough to
# prefer a node a bin or two below FGD's best for what the node would look like afterwards — where a
# regime's lesson lives — yet never to a node FGD rates poorly.
RESIDUAL_BOUND = 2.5


def base_network(*, residual_bound: float = RESIDUAL_BOUND) -> PlacementNet:
    """FGD exactly (``g ≡ 0``), with the committed ``gpu`` profile's architecture and feature
    normalisation (so the search's σ is in standardised feature units)."""
    net = copy.deepcopy(load_checkpoint(DEFAULT_CHECKPOINT)[0][PROFILE])
    net.zero_correction()
    net.residual_bound = residual_bound
    return net


def fine_tune(net: PlacementNet, episodes: Sequence[Episode], *, seed: int, generations: int, pairs: int = 4,
              sigma: float = 0.5, learning_rate: float = 0.1, episodes_per_eval: int = 2) -> PlacementNet:
    """``generations`` of antithetic ES from ``net`` (a copy) on ``episodes`` taken in turn.

    ``sigma`` 0.5 in standardised units: a perturbation must change which of FGD's near-best nodes wins
    on enough of a window's decisions to move its outcome; ``learning_rate`` 0.1 lets a few dozen
    generations travel that far; ``pairs`` 4 × ``episodes_per_eval`` 2 keeps a generation
    under a second on one core."""
    if not episodes:
        raise ValueError("no windows to train on")
    set_random_seed(seed)
    torch.set_num_threads(1)  # one thread also makes torch's reductions deterministic
    es = EvolutionStrategy(copy.deepcopy(net), lambda i: episodes[i % len(episodes)], reward=WINDOW_REWARD,
                           pairs=pairs, sigma=sigma, learning_rate=learning_rate,
                           episodes_per_eval=episodes_per_eval, seed=seed,
                           active=search_mask(CORRECTION_FEATURES))
    for _ in range(generations):
        es.generation()
    return es.finish()


def restarted(parent: PlacementNet) -> PlacementNet:
    """The parent's network with its correction zeroed (FGD again): its serving settings (residual bound,
    gates) and feature normalisation, not its weights. A search from a trained correction barely moves it
    (a saturated ``arctan`` makes σ-sized steps change few decisions): fine-tuned from the stale model on
    48 new-regime windows it stayed where it was (+0.15 ± 0.16 unschedulable pods a window), while the
    same search from ``g ≡ 0`` on the same kind of windows gains ~0.9 pods a window over it."""
    net = copy.deepcopy(parent)
    net.zero_correction()
    return net


def random_network(seed: int, *, scale: float = 1.0) -> PlacementNet:
    """A correction with random head weights on :data:`CORRECTION_FEATURES` (standard normal × ``scale``):
    the right layout and normalisation, no training."""
    net = base_network()
    rng = np.random.default_rng(seed)
    theta = net.search_vector()
    for name in CORRECTION_FEATURES:
        theta[IDX[name]] = scale * rng.standard_normal()
    net.set_search_vector(theta)
    return net


def perturbed(net: PlacementNet, seed: int, *, scale: float) -> PlacementNet:
    """A copy of ``net`` with its correction's head weights moved by ``scale`` × standard normal noise."""
    out = copy.deepcopy(net)
    rng = np.random.default_rng(seed)
    theta = out.search_vector()
    for name in CORRECTION_FEATURES:
        theta[IDX[name]] += scale * rng.standard_normal()
    out.set_search_vector(theta)
    return out


def write_checkpoint(net: PlacementNet, path: Path, *, trained_on: str, seed: int) -> Path:
    """One-profile checkpoint (``gpu``) that the registry's validator loads as serving would."""
    save_checkpoint(path, {PROFILE: net}, extra={"seed": seed, "trained_on": {PROFILE: trained_on}})
    return path
