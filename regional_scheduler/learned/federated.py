"""The learned placement correction trained across regions with Flower, each region on its own openb data.

The model is the ``gpu`` profile's correction of FGD (:mod:`.policy`): a residual policy whose
correction ``g`` is linear over the 17 :data:`~.algorithm.CORRECTION_FEATURES`, so its trainable
weights are one float vector of 17 head weights (``mlp_scale`` stays 0). Training starts where the
``gpu`` profile's training starts: ``g ≡ 0``, i.e. FGD itself, with the committed profile's feature
normalisation and gates (:func:`start_network`).

**Regions** (:func:`placement_regions`). Region ``i`` is a regional scheduler with its own workload and
its own machines: a distinct openb pod list of the training split (``checkpoints/README.md``,
"Split"; the held-out lists, :data:`HELD_OUT_LISTS`, are never used here) and its own pool of openb
nodes, disjoint from every other region's pool and drawn with a bias towards one GPU model, so the
node mixes differ. An episode is the openb protocol (:func:`~.env.openb_episode`) on a random
``episode_nodes`` of the region's pool, its pod list sub-sampled and inflated to that capacity.
Every episode's seed encodes (run seed, region, split, index), so the **training**, **validation**
(Flower's per-round evaluation) and **test** (the comparison's figures) episodes of all regions have
pairwise distinct seeds: nobody trains on an episode that any figure is measured on.

**Training** is Fed-ES: in every round each region's client runs a few generations of the ``gpu``
profile's evolution strategy (:class:`~.algorithm.EvolutionStrategy`, antithetic, rank-shaped,
Adam) on its own training episodes from the global weights, and the server averages the new weights
(FedAvg, or FedProx, where each region's ES fitness also pays ``mu/2 ||w − w_global||²`` in points
of GPU allocation). A region sends back its search's weights only if they beat the received ones on a
few other training episodes of its own, else the received ones (the ``gpu`` profile's training keeps
its search only if it beats its start, for the same reason: a short search on noisy episodes can make
FGD worse). Only the 17 weights, the mean training return and whether the search was kept leave a
region.

**Measure.** Every figure is the GPU allocation (%) when the arrived GPU request reaches 100 % of the
cluster's capacity (the openb benchmark's headline, as ``meridian bench placement`` measures it),
**higher is better**, measured online: the policy is never told the episode's pod list, as in a live
scheduler (``prepare=False``). Training rollouts use the training environment as the ``gpu`` profile's
search does (:func:`~.algorithm.rollout`), whose FGD knows the episode's own pod list; that is the
region's own past, never a test episode.

:func:`compare_placement` measures, on every region's test episodes:

* **untrained**: FGD (the ``fgd`` policy, which the zero correction equals);
* **local**: the region's own training episodes only, the same per-round procedure and generations;
* **federated**: FedAvg or FedProx over all regions (:func:`meridian.federated.engine.run_federated`);
* **federated_finetuned**: the federated weights and a few more generations on the region's own
  training episodes (episodes after those the rounds used);
* **central**: the same generations with every candidate scored on one training episode of *every*
  region per ``episodes_per_eval`` (the pooled data, as much of it as all clients together see), the
  upper bound federated training approaches.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meridian.federated.comparison import Comparison
from meridian.federated.engine import FederatedResult, RoundStats
from meridian.federated.federate import federate
from meridian.federated.privacy import PrivacySettings
from meridian.model import Node, Pod
from regional_scheduler.learned.algorithm import CORRECTION_FEATURES, EvolutionStrategy, search_mask
from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT
from regional_scheduler.learned.env import Episode, openb_episode
from regional_scheduler.learned.policy import DEFAULT_RESIDUAL_BOUND, PlacementNet

#: The training lists in the order regions take them: CPU-heavy and shared-GPU lists alternate, so
#: every region count mixes both kinds of workload.
REGION_LISTS: tuple[str, ...] = ("cpu050", "gpushare40", "cpu200", "gpushare80", "cpu0", "gpushare20", "cpu300",
                                 "gpushare100", "cpu100", "cpu037", "cpu072", "cpu235", "cpu250")
#: The openb lists held out from every training and choice of the learned policy (``checkpoints/README.md``).
HELD_OUT_LISTS: tuple[str, ...] = ("default", "gpuspec05", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
                                   "multigpu20", "multigpu40", "multigpu50")
#: GPU models a region's node pool favours, in region order (the openb node list's models with ≥ 30 nodes).
FAVOURED_MODELS: tuple[str, ...] = ("G2", "T4", "P100", "V100M16", "G3", "V100M32")

TRAIN, VALIDATION, TEST = 0, 1, 2
_PER_SPLIT = 1_000_000  # episodes per (region, split): the seed's lowest digits
_MAX_REGIONS = 16
#: At most one region per training pod list.
MAX_PLACEMENT_REGIONS = len(REGION_LISTS)
_CHECK_FIRST = 500_000  # a region's training episodes from here on are its acceptance checks, not ES's

#: Position of each trainable weight in :meth:`PlacementNet.search_vector` (the correction's head weights).
ACTIVE = np.flatnonzero(search_mask(CORRECTION_FEATURES))
METRIC = "gpu_alloc_pct_at_100"


@functools.cache
def _openb_nodes() -> tuple[Node, ...]:
    from meridian.traces import openb

    return tuple(openb.load_nodes())


@functools.cache
def _pod_list(name: str) -> tuple[Pod, ...]:
    from meridian.traces import openb

    return tuple(openb.load_pods(openb.openb_dir() / f"openb_pod_list_{name}.csv"))


@dataclass(frozen=True)
class PlacementRegion:
    """One regional scheduler's data: its openb pod list and its pool of nodes (indices into the openb
    node list). Small and picklable: the traces are read where the episodes are made, in the region."""

    name: str
    index: int
    pod_list: str
    favoured_model: str
    node_indices: tuple[int, ...]
    episode_nodes: int
    seed: int

    def nodes(self) -> list[Node]:
        every = _openb_nodes()
        return [every[i] for i in self.node_indices]

    def model_mix(self) -> dict[str, int]:
        """Nodes of the pool per GPU model."""
        counts: dict[str, int] = {}
        for n in self.nodes():
            counts[n.gpu_model] = counts.get(n.gpu_model, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def episode_seed(self, split: int, i: int) -> int:
        """Distinct for every (run seed, region, split, index): splits and regions never share an episode."""
        if not 0 <= i < _PER_SPLIT or split not in (TRAIN, VALIDATION, TEST):
            raise ValueError(f"episode {i} of split {split} is outside the region's seed range")
        return ((self.seed * _MAX_REGIONS + self.index) * 3 + split) * _PER_SPLIT + i

    def episode(self, split: int, i: int, *, nodes: int | None = None) -> Episode:
        """Episode ``i`` of ``split`` on ``nodes`` (default ``episode_nodes``) random nodes of the pool."""
        pool = self.nodes()
        size = self.episode_nodes if nodes is None else nodes
        if not 1 <= size <= len(pool):
            raise ValueError(f"{size} nodes per episode: between 1 and the pool's {len(pool)}")
        return openb_episode(_pod_list(self.pod_list), pool, self.episode_seed(split, i), node_fraction=size / len(pool))


def placement_regions(count: int, seed: int = 0, *, pool_nodes: int = 120, episode_nodes: int = 20,
                      bias: float = 10.0) -> list[PlacementRegion]:
    """``count`` regions (1–13): region ``i`` gets :data:`REGION_LISTS` ``[i]`` and ``pool_nodes`` openb
    nodes no other region has, drawn (seeded) with weight ``bias`` on :data:`FAVOURED_MODELS` ``[i mod 6]``
    and 1 on the others; its episodes run on ``episode_nodes`` of them (small, so one ES generation
    takes about a second on one core)."""
    if not 1 <= count <= len(REGION_LISTS):
        raise ValueError(f"{count} regions: between 1 and {len(REGION_LISTS)} (one training pod list each)")
    if not 0 <= seed < 1_000:
        raise ValueError(f"seed {seed}: between 0 and 999")
    nodes = _openb_nodes()
    if count * pool_nodes > len(nodes) or not 1 <= episode_nodes <= pool_nodes:
        raise ValueError(f"{count} pools of {pool_nodes} nodes (episodes of {episode_nodes}) do not fit "
                         f"{len(nodes)} openb nodes")
    models = np.array([n.gpu_model for n in nodes])
    free = np.ones(len(nodes), dtype=bool)
    rng = np.random.default_rng([seed, 2024])
    regions = []
    for i in range(count):
        favoured = FAVOURED_MODELS[i % len(FAVOURED_MODELS)]
        weight = np.where(models == favoured, bias, 1.0) * free
        pick = np.sort(rng.choice(len(nodes), size=pool_nodes, replace=False, p=weight / weight.sum()))
        free[pick] = False
        regions.append(PlacementRegion(name=f"r{i}-{REGION_LISTS[i]}-{favoured}", index=i, pod_list=REGION_LISTS[i],
                                       favoured_model=favoured, node_indices=tuple(int(j) for j in pick),
                                       episode_nodes=episode_nodes, seed=seed))
    return regions


def start_network(residual_bound: float = DEFAULT_RESIDUAL_BOUND) -> PlacementNet:
    """The ``gpu`` profile's search start: the committed profile's normalisation and gates with ``g ≡ 0``
    (FGD exactly), at ``residual_bound`` (0.45, the training default: only FGD's tied best nodes move)."""
    from regional_scheduler.learned.checkpoint import load_checkpoint

    net = load_checkpoint(DEFAULT_CHECKPOINT)[0]["gpu"]
    net.residual_bound = residual_bound
    net.zero_correction()
    return net


def search_vector(weights: np.ndarray, net: PlacementNet) -> np.ndarray:
    """The network's ``[head ‖ mlp_scale]`` with the correction's 17 weights in place, the rest 0."""
    vec = np.zeros(net.n_node + 1)
    vec[ACTIVE] = weights
    return vec


def with_weights(net: PlacementNet, weights: np.ndarray) -> PlacementNet:
    out = copy.deepcopy(net)
    out.set_search_vector(search_vector(weights, net))
    return out


class _ProximalES(EvolutionStrategy):
    """:class:`EvolutionStrategy` whose fitness pays FedProx's ``mu/2 ||θ − θ_global||²`` (points of GPU
    allocation per unit² of weight), so a region's search stays near the global weights."""

    def __init__(self, net: PlacementNet, episodes: Callable[[int], Episode], *, proximal_mu: float,
                 **kwargs: Any) -> None:
        super().__init__(net, episodes, **kwargs)
        self.anchor = self.theta.copy()
        self.proximal_mu = proximal_mu

    def _fitness(self, theta: np.ndarray, batch: list[Episode]) -> tuple[float, float]:
        fitness, allocation = super()._fitness(theta, batch)
        if self.proximal_mu:
            fitness -= self.proximal_mu / 2 * float(np.sum((theta - self.anchor) ** 2))
        return fitness, allocation


def _until_full(episode: Episode) -> list[Pod]:
    """The arrivals up to the one that brings the arrived GPU request to 100 % of capacity: all the
    benchmark's figure depends on."""
    cap = sum(n.allocatable_resources.gpu for n in episode.nodes) * 1000
    arrived = 0
    for k, pod in enumerate(episode.arrivals):
        arrived += pod.requests.gpu_milli_total
        if arrived >= cap:
            return list(episode.arrivals[:k + 1])
    return list(episode.arrivals)


def online_allocation_pct(net: PlacementNet | None, episode: Episode) -> float:
    """GPU allocation (%) at 100 % arrived of the learned policy with ``net`` (``None``: the ``fgd``
    policy) on ``episode``, never told the episode's pod list (a live scheduler's situation)."""
    from meridian.simulator import run_arrivals
    from regional_scheduler.framework import Scheduler
    from regional_scheduler.learned.serving import LearnedScorer, ServingSettings
    from regional_scheduler.policies.learned import LearnedPolicy
    from regional_scheduler.policies.registry import get_policy

    policy = get_policy("fgd") if net is None else \
        LearnedPolicy(ServingSettings(enforce_budget=False), scorer=LearnedScorer({"gpu": net}))
    result = run_arrivals(Scheduler(policy, seed=0), episode.nodes, _until_full(episode), workload=episode.workload,
                          scenario="openb", seed=0, prepare=False)
    return float(result.curve[100]["gpu_alloc_pct"])


@dataclass(frozen=True)
class SearchSettings:
    """The ES of one round of one region (the ``gpu`` profile's ``sigma`` and ``learning_rate``; fewer
    pairs, so a generation on a 20-node episode takes about a second)."""

    generations: int = 2
    pairs: int = 3
    sigma: float = 0.2
    learning_rate: float = 0.05
    episodes_per_eval: int = 1


class PlacementTask:
    """One region's Flower task (or, with several regions, the pooled data of the central model): ES
    generations on its training episodes from the received weights; the loss is the negative online GPU
    allocation (%) on its validation episodes."""

    metric_names = frozenset({"train_return", "kept_search"})

    def __init__(self, regions: Sequence[PlacementRegion], net: PlacementNet, search: SearchSettings, *,
                 validation_episodes: int, noise_key: int, check_episodes: int = 2) -> None:
        self.check_episodes = check_episodes
        self.regions = tuple(regions)
        self.net = net
        self.search = search
        self.validation_episodes = validation_episodes
        self.noise_key = noise_key
        self._fits = 0

    @property
    def episodes_per_generation(self) -> int:
        """One training episode of every region per ``episodes_per_eval``."""
        return self.search.episodes_per_eval * len(self.regions)

    def training_episode(self, i: int) -> Episode:
        region = self.regions[i % len(self.regions)]
        return region.episode(TRAIN, i // len(self.regions))

    def initial_parameters(self) -> list[np.ndarray]:
        return [np.zeros(ACTIVE.size)]

    def fit(self, parameters: list[np.ndarray], *, epochs: int, proximal_mu: float,
            seed: int) -> tuple[list[np.ndarray], int, dict[str, float]]:
        """Round ``k`` (this task's ``k``-th fit) searches on the training episodes after those of rounds
        before it, as a local run of the same rounds does."""
        generations = self.search.generations * epochs
        out = self.fit_from(parameters[0], first_episode=self._fits * generations * self.episodes_per_generation,
                            generations=generations, proximal_mu=proximal_mu, seed=seed)
        self._fits += 1
        return out

    def fit_from(self, weights: np.ndarray, *, first_episode: int, generations: int, proximal_mu: float = 0.0,
                 seed: int = 0) -> tuple[list[np.ndarray], int, dict[str, float]]:
        """``generations`` ES generations from ``weights`` on training episodes ``first_episode`` on; the
        result is kept only if it beats ``weights`` online on ``check_episodes`` other training episodes of
        each region (as the ``gpu`` profile's training keeps its search only if it beats the start), so a
        region never sends back weights that did worse on its own data than the ones it received."""
        s = self.search
        start = np.asarray(weights, dtype=np.float64)
        es = _ProximalES(with_weights(self.net, start), self.training_episode,
                         proximal_mu=proximal_mu, pairs=s.pairs, sigma=s.sigma, learning_rate=s.learning_rate,
                         episodes_per_eval=self.episodes_per_generation, active=search_mask(CORRECTION_FEATURES),
                         seed=int(np.random.SeedSequence([seed, self.noise_key]).generate_state(1)[0]))
        es.episode_counter = first_episode
        returns = [es.generation()["centre_return"] for _ in range(generations)]
        found = es.theta[ACTIVE].copy()
        kept = self._beats(found, start, first_episode) if self.check_episodes else True
        n = generations * self.episodes_per_generation
        return ([found if kept else start.copy()], n,
                {"train_return": float(np.mean(returns)) if returns else 0.0, "kept_search": float(kept)})

    def _beats(self, found: np.ndarray, start: np.ndarray, first_episode: int) -> bool:
        """``found``'s mean online GPU allocation on the check episodes is strictly above ``start``'s.

        Online, as the figures are measured, not in the search's training environment: there FGD knows
        the episode's pod list, and a correction that helps there need not help a policy that only sees
        the past (accepted in the training environment, short searches on small episodes lost points to
        FGD online)."""
        first = _CHECK_FIRST * len(self.regions) + first_episode
        batch = [self.training_episode(first + j) for j in range(self.check_episodes * len(self.regions))]

        def allocation(w: np.ndarray) -> float:
            net = with_weights(self.net, w)
            return float(np.mean([online_allocation_pct(net, ep) for ep in batch]))

        return allocation(found) > allocation(start)

    def validation_allocation(self, weights: np.ndarray) -> float:
        net = with_weights(self.net, weights)
        return float(np.mean([online_allocation_pct(net, r.episode(VALIDATION, i))
                              for r in self.regions for i in range(self.validation_episodes)]))

    def evaluate(self, parameters: list[np.ndarray]) -> tuple[float, int, dict[str, float]]:
        return -self.validation_allocation(parameters[0]), self.validation_episodes * len(self.regions), {}


def _rounds(task: PlacementTask, *, rounds: int, seed: int) -> np.ndarray:
    """``rounds`` fits of ``task`` in a row, each from the last, with the seeds a federated run gives round
    ``k`` (so a one-region federation is exactly this)."""
    w = task.initial_parameters()[0]
    for k in range(rounds):
        w = task.fit([w], epochs=1, proximal_mu=0.0, seed=seed * 1000 + k + 1)[0][0]
    return w


def compare_placement(regions: Sequence[PlacementRegion], *, rounds: int = 4, generations_per_round: int = 2,
                      pairs: int = 3, sigma: float = 0.2, learning_rate: float = 0.05, episodes_per_eval: int = 1,
                      strategy: str = "fedavg", proximal_mu: float = 1.0, seed: int = 0,
                      validation_episodes: int = 1, test_episodes: int = 3, test_nodes: int = 60,
                      check_episodes: int = 2, finetune_generations: int = 2,
                      residual_bound: float = DEFAULT_RESIDUAL_BOUND,
                      on_round: Callable[[RoundStats], None] | None = None,
                      privacy: PrivacySettings | None = None,
                      secure_aggregation: bool = False) -> tuple[Comparison, FederatedResult]:
    """FGD, local, federated, federated + fine-tune and central corrections on every region's test episodes,
    in one run. Figures are GPU allocation (%) at 100 % arrived, **higher is better** (``totals["metric"]``);
    ``federated_vs_central`` and ``federated_vs_untrained`` are differences in points; the ``*_beats_*_regions``
    counts include ties (a region whose every search was refused keeps FGD's figure exactly).

    Test episodes run on ``test_nodes`` nodes of the region's pool (more than a training episode's: one
    placement moves a small cluster's figure by points, so small test clusters mostly measure chance)."""
    search = SearchSettings(generations=generations_per_round, pairs=pairs, sigma=sigma,
                            learning_rate=learning_rate, episodes_per_eval=episodes_per_eval)
    net = start_network(residual_bound)

    def task(members: Sequence[PlacementRegion], key: int) -> PlacementTask:
        return PlacementTask(members, net, search, validation_episodes=validation_episodes, noise_key=key,
                             check_episodes=check_episodes)

    t0 = time.perf_counter()
    local = {r.name: _rounds(task([r], r.index), rounds=rounds, seed=seed) for r in regions}
    t1 = time.perf_counter()
    central = _rounds(task(regions, _MAX_REGIONS), rounds=rounds, seed=seed)
    t2 = time.perf_counter()
    tasks = {r.name: task([r], r.index) for r in regions}
    # Every region reports the same example count: its generations' episodes.
    result = federate(tasks, rounds=rounds, strategy=strategy, proximal_mu=proximal_mu, seed=seed, on_round=on_round,
                      privacy=privacy, secure_aggregation=secure_aggregation,
                      max_examples=generations_per_round * episodes_per_eval)
    t3 = time.perf_counter()
    federated = result.parameters[0]
    per_region: dict[str, dict[str, Any]] = {}
    for r in regions:
        tuned = task([r], r.index).fit_from(
            federated, first_episode=rounds * generations_per_round * episodes_per_eval,
            generations=finetune_generations, seed=seed * 1000 + rounds + 1)[0][0]
        test = [r.episode(TEST, i, nodes=test_nodes) for i in range(test_episodes)]
        models: dict[str, PlacementNet | None] = {
            "untrained": None, "local": with_weights(net, local[r.name]), "federated": with_weights(net, federated),
            "central": with_weights(net, central), "federated_finetuned": with_weights(net, tuned)}
        figures = {name: [online_allocation_pct(m, ep) for ep in test] for name, m in models.items()}
        per_region[r.name] = {name: float(np.mean(v)) for name, v in figures.items()}
        per_region[r.name] |= {"episode_nodes": r.episode_nodes, "test_nodes": test_nodes, "test_episodes": test_episodes,
                               "federated_ge_untrained_episodes": int(sum(
                                   f >= u for f, u in zip(figures["federated"], figures["untrained"], strict=True)))}
    t4 = time.perf_counter()
    names = ("untrained", "local", "federated", "central", "federated_finetuned")
    totals: dict[str, Any] = {k: float(np.mean([v[k] for v in per_region.values()])) for k in names}
    totals["metric"] = f"{METRIC} (GPU allocation % at 100 % arrived, online, held-out test episodes; higher is better)"
    totals["federated_beats_local_regions"] = sum(v["federated"] >= v["local"] for v in per_region.values())
    totals["finetuned_beats_local_regions"] = sum(v["federated_finetuned"] >= v["local"] for v in per_region.values())
    totals["federated_beats_untrained_regions"] = sum(v["federated"] >= v["untrained"] for v in per_region.values())
    totals["federated_vs_central"] = totals["federated"] - totals["central"]
    totals["federated_vs_untrained"] = totals["federated"] - totals["untrained"]
    totals["local_vs_untrained"] = totals["local"] - totals["untrained"]
    wall = {"local": t1 - t0, "central": t2 - t1, "federated": t3 - t2, "finetune_and_test": t4 - t3}
    return Comparison(per_region, totals, result.rounds, wall, len(result.refused_updates), result.privacy), result


def save_federated_checkpoint(path: Path, parameters: Sequence[np.ndarray], *,
                              residual_bound: float = DEFAULT_RESIDUAL_BOUND) -> None:
    """A placement checkpoint serving the federated correction: the ``gpu`` profile is the search's start
    (:func:`start_network`) with the federated weights, the ``cpu`` profile the committed one unchanged (the
    federation trains the GPU clusters' correction only). Loadable by serving and by the model registry's
    placement validator like any retrained checkpoint."""
    from regional_scheduler.learned.checkpoint import load_checkpoint, save_checkpoint

    nets, extra = load_checkpoint(DEFAULT_CHECKPOINT)
    (weights,) = parameters
    if weights.shape != (ACTIVE.size,):
        raise ValueError(f"a federated placement correction has {ACTIVE.size} weights, got shape {weights.shape}")
    nets["gpu"] = with_weights(start_network(residual_bound), np.asarray(weights, dtype=np.float64))
    save_checkpoint(Path(path), nets, extra={**extra, "federated": True})
