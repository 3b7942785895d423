"""Training the placement policy: behaviour cloning from the best heuristic, then evolution-strategies
policy search on the episode return.

Why not PPO (see ``docs/learned-placement.md`` for the full argument): the return that matters —
GPU allocation when the arrived request reaches 100 % — is decided by thousands of placements, each
of which moves it by a hundredth of a point, and the per-step layered reward is only a proxy. PPO's
per-step credit assignment is dominated by noise at that horizon with the few hundred episodes a
15-minute CPU budget allows, and its updates can undo the imitation start. Evolution strategies
(Salimans et al., 2017, "Evolution Strategies as a Scalable Alternative to Reinforcement Learning")
optimise the episode return directly, need no value function and no per-step gradients, and are
robust to long horizons and sparse terminal rewards. We search a small, well-conditioned subspace —
the linear *heuristic head* over the (normalised) node features plus the scale of the imitation
MLP — with antithetic sampling and common random numbers (each ± pair runs on the same episode),
so a pair's difference measures the policy change, not the workload's luck.

Everything is deterministic for a seed (:func:`meridian.seeding.set_random_seed`; one torch thread).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from meridian.model import Node, Pod
from meridian.seeding import set_random_seed
from regional_scheduler.learned import imitation
from regional_scheduler.learned.augment import augmented_pod_list, pods_by_class, resampled_pod_list
from regional_scheduler.learned.env import Episode, PlacementEnv, openb_episode, seed_episode
from regional_scheduler.learned.features import IDX
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.learned.reward import RewardConfig, fragmentation

# The features a linear correction of FGD may read (``--search-features``): cheap per node (no
# device sort, no resource-allocation scores), and what tells nodes with the same FGD score apart —
# how full the node is and would be, how well the pod fills it (best fit), FGD's raw delta inside
# the integer score bin, and whether constrained pods need the node's GPU model.
CORRECTION_FEATURES: tuple[str, ...] = (
    "free_cpu_frac", "free_mem_frac", "free_gpu_frac", "gpu_count_abs", "idle_gpus_abs", "partial_gpus_abs",
    "max_device_free", "after_cpu_frac", "after_mem_frac", "after_gpu_frac", "after_idle_gpus_abs",
    "best_fit_leftover", "fgd_delta_gpus", "fgd_frag_before_gpus", "node_unused", "model_pressure",
    "model_pressure_free_pod",
)


MLP_SCALE = "mlp_scale"

# The node features that vary on a CPU-only cluster (seed-50x200), plus the MLP's scale: the GPU,
# power and carbon columns are constant there, so their head weights change nothing and only add
# noise to the search's gradient estimate (``--cpu-search-features cpu``).
CPU_SEARCH_FEATURES: tuple[str, ...] = (
    "free_cpu_frac", "free_mem_frac", "free_cpu_abs", "after_cpu_frac", "after_mem_frac", "after_cpu_abs",
    "best_fit_leftover", "least_allocated", "balanced", "node_unused", "becomes_cpu_full", "becomes_mem_full",
    "mlp_scale",
)


def search_mask(features: Sequence[str] | None) -> np.ndarray | None:
    """Which coordinates of ``[heuristic head ‖ mlp_scale]`` the search may move: the head weights of
    ``features``, and ``mlp_scale`` only if the name ``"mlp_scale"`` is listed (otherwise it stays
    where it starts: 0 from FGD, so the correction stays linear); ``None`` = all."""
    if features is None:
        return None
    unknown = set(features) - set(IDX) - {MLP_SCALE}
    if unknown:
        raise ValueError(f"unknown node feature(s) {sorted(unknown)}")
    mask = np.zeros(len(IDX) + 1, dtype=bool)
    mask[[IDX[f] for f in features if f != MLP_SCALE]] = True
    mask[-1] = MLP_SCALE in features
    return mask


@dataclass
class EpisodeResult:
    episode_return: float
    allocation: float
    n_arrived: int
    n_failed: int
    steps: int
    fragmentation: float = 0.0  # the reward's final fragmentation (0–1): seed Gini / 100 on a CPU-only cluster


def rollout(fast: NumpyPlacementNet, episode: Episode, *, reward: RewardConfig | None = None) -> EpisodeResult:
    """Greedy episode of the residual policy, as served (highest logit, first on ties — the
    scheduler's rule); features are built only for FGD's near-best candidates."""
    env = PlacementEnv(episode, reward=reward, lazy_features=True)
    obs, info = env.reset()
    total, steps = 0.0, 0
    while not env.done:
        logits = fast.residual_columns(info["base_scores"], info["features_of"], obs["pod_features"])
        obs, r, _, _, info = env.step(int(info["candidates"][int(np.argmax(logits))]))
        total += r
        steps += 1
    assert env.state is not None
    return EpisodeResult(total, info["allocation"], env.n_arrived, env.n_failed, steps,
                         fragmentation(env.state, env._gpu_frag()))


@dataclass(frozen=True)
class MeanFragmentationCap:
    """A constraint on the *mean* final fragmentation of a batch of episodes (``--cpu-gini-mean-cap``).

    The benchmark's target (seed-50x200: Gini ≤ 31) is a mean over seeds, so a per-episode cap
    (``RewardConfig.fragmentation_cap``) is stricter than needed: it also forbids a high Gini on the
    few episodes where filling nodes completely saves pods, even when the other episodes leave room
    under the mean. This cap costs ``over_cap`` per unit (0–1) of the batch mean above ``cap``."""

    cap: float
    over_cap: float

    def penalty(self, results: Sequence[EpisodeResult]) -> float:
        mean = float(np.mean([r.fragmentation for r in results]))
        return self.over_cap * max(0.0, mean - self.cap)


def batch_fitness(results: Sequence[EpisodeResult], mean_cap: MeanFragmentationCap | None = None) -> float:
    """A candidate's fitness on a batch: the mean episode return, less the mean-fragmentation
    penalty when ``mean_cap`` is given."""
    fitness = float(np.mean([r.episode_return for r in results]))
    return fitness - (mean_cap.penalty(results) if mean_cap is not None else 0.0)


EpisodeFactory = Callable[[int], Episode]


def openb_episodes(pod_lists: Sequence[Sequence[Pod]], nodes: Sequence[Node], *,
                   node_fraction: float = 0.25, augment_p: float = 0.0,
                   augment_share: tuple[float, float] = (0.05, 0.35),
                   mix: dict[str, int] | None = None) -> EpisodeFactory:
    """Episode ``i``: pod list ``i mod L`` on a random ``node_fraction`` of the nodes, seeded by ``i``.

    With ``augment_p`` > 0, episode ``i``'s pod list gets, with that probability, GPU-model
    constraints on a random share (uniform in ``augment_share``) of its GPU pods, drawn from the node
    list's models (:mod:`~regional_scheduler.learned.augment`); the target workload is the
    augmented list, as a ``gpuspec`` list is its own target workload.

    With ``mix`` (pods per class, e.g. :data:`~regional_scheduler.learned.augment.DEFAULT_MIX`),
    episode ``i``'s list is instead drawn from all the lists pooled, to that mix, with seed ``i``
    (:func:`~regional_scheduler.learned.augment.resampled_pod_list`)."""
    pools = pods_by_class(pod_lists) if mix is not None else {}

    def make(i: int) -> Episode:
        pods = pod_lists[i % len(pod_lists)] if mix is None else resampled_pod_list(pools, mix, i)
        if augment_p > 0:
            pods, _ = augmented_pod_list(pods, nodes, i, p_augment=augment_p, share_range=augment_share)
        return openb_episode(pods, nodes, 10_000 + i, node_fraction=node_fraction)
    return make


def seed_episodes(first_seed: int = 1_000) -> EpisodeFactory:
    """The seed analysis' 50×200 setting on training seeds (the benchmark uses 0–9)."""
    return lambda i: seed_episode(first_seed + i)


@dataclass
class SearchLog:
    generations: list[dict[str, Any]] = field(default_factory=list)


class EvolutionStrategy:
    """Antithetic ES over ``[heuristic head ‖ mlp_scale]`` of a :class:`PlacementNet`.

    Keyword arguments (all documented with their defaults' reason):

    - ``pairs`` (6): ± perturbation pairs per generation; 2·pairs + 1 episodes per generation.
    - ``sigma`` (0.05): perturbation scale in the head's (normalised-feature) units — small enough
      that a perturbed policy still places like the imitation start, big enough to change ties.
    - ``learning_rate`` (0.02): Adam step on the rank-shaped gradient estimate.
    - ``episodes_per_eval`` (1): episodes per candidate (all candidates of a generation share them).
    - ``active`` (all): boolean mask of the coordinates of ``[head ‖ mlp_scale]`` the search moves
      (:func:`search_mask`).
    - ``mean_cap`` (none): a :class:`MeanFragmentationCap` on each candidate's batch of episodes.
    - ``layers`` (none): MLP layers (:data:`~regional_scheduler.learned.policy.SEARCHABLE_LAYERS`)
      whose weights the search moves too, all of them — the head alone is linear in the node
      features, so on a CPU-only cluster (where the resource features are collinear) it can only
      switch between a few fixed rankings; a conditional rule needs the MLP.
    """

    def __init__(self, net: PlacementNet, episodes: EpisodeFactory, *, reward: RewardConfig | None = None,
                 pairs: int = 6, sigma: float = 0.05, learning_rate: float = 0.02, episodes_per_eval: int = 1,
                 seed: int = 0, active: np.ndarray | None = None, layers: Sequence[str] = (),
                 mean_cap: MeanFragmentationCap | None = None) -> None:
        self.net = net
        self.mean_cap = mean_cap
        self.episodes = episodes
        self.reward = reward
        self.pairs, self.sigma, self.learning_rate = pairs, sigma, learning_rate
        self.episodes_per_eval = episodes_per_eval
        self.rng = np.random.default_rng(seed)
        self.layers = tuple(layers)
        self.theta = net.search_vector(self.layers)
        head = np.ones(net.n_node + 1, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        self.active = np.concatenate([head, np.ones(self.theta.size - head.size, dtype=bool)])
        self.fast = NumpyPlacementNet(net)
        self._m = np.zeros_like(self.theta)
        self._v = np.zeros_like(self.theta)
        self._t = 0
        self.episode_counter = 0
        self.steps = 0
        self.log = SearchLog()

    def _fitness(self, theta: np.ndarray, batch: list[Episode]) -> tuple[float, float]:
        fast = self.fast.with_search_vector(theta, self.layers)
        results = [rollout(fast, ep, reward=self.reward) for ep in batch]
        self.steps += sum(r.steps for r in results)
        return batch_fitness(results, self.mean_cap), float(np.mean([r.allocation for r in results]))

    def generation(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch = [self.episodes(self.episode_counter + j) for j in range(self.episodes_per_eval)]
        self.episode_counter += self.episodes_per_eval
        noise = self.rng.standard_normal((self.pairs, self.theta.size)) * self.active
        plus = np.array([self._fitness(self.theta + self.sigma * e, batch)[0] for e in noise])
        minus = np.array([self._fitness(self.theta - self.sigma * e, batch)[0] for e in noise])
        centre_return, centre_alloc = self._fitness(self.theta, batch)
        # Centred ranks over all 2·pairs returns (fitness shaping), then the antithetic estimate.
        ranks = np.empty(2 * self.pairs)
        ranks[np.argsort(np.concatenate([plus, minus]), kind="stable")] = np.arange(2 * self.pairs)
        shaped = ranks / (2 * self.pairs - 1) - 0.5
        grad = ((shaped[: self.pairs] - shaped[self.pairs:])[:, None] * noise).sum(axis=0) / (2 * self.pairs * self.sigma)
        self._adam(grad)
        record = {
            "generation": len(self.log.generations),
            "centre_return": centre_return,
            "centre_allocation": centre_alloc,
            "best_perturbed_return": float(max(plus.max(), minus.max())),
            "mean_perturbed_return": float(np.mean(np.concatenate([plus, minus]))),
            "grad_norm": float(np.linalg.norm(grad)),
            "theta_norm": float(np.linalg.norm(self.theta)),
            "steps": self.steps,
            "wall_s": time.perf_counter() - t0,
        }
        self.log.generations.append(record)
        return record

    def _adam(self, grad: np.ndarray, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        self._t += 1
        self._m = beta1 * self._m + (1 - beta1) * grad
        self._v = beta2 * self._v + (1 - beta2) * grad * grad
        m_hat = self._m / (1 - beta1 ** self._t)
        v_hat = self._v / (1 - beta2 ** self._t)
        self.theta = self.theta + self.learning_rate * m_hat / (np.sqrt(v_hat) + eps)

    def finish(self) -> PlacementNet:
        self.net.set_search_vector(self.theta, self.layers)
        return self.net


def coordinate_index(name: str) -> int:
    """Position of a head feature (or ``"mlp_scale"``) in :meth:`PlacementNet.search_vector`."""
    if name == MLP_SCALE:
        return len(IDX)
    if name not in IDX:
        raise ValueError(f"unknown node feature {name!r}")
    return IDX[name]


def line_search(net: PlacementNet, episodes: EpisodeFactory, *, coordinate: str, deltas: Sequence[float],
                n_episodes: int, reward: RewardConfig | None = None, mean_cap: MeanFragmentationCap | None = None,
                first: int = 3_000_000, layers: Sequence[str] = ()) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Shift one coordinate of the search vector by each of ``deltas`` (0, the start, is always
    tried) and keep the shift with the best :func:`batch_fitness` on ``n_episodes`` episodes from
    index ``first`` of the factory (apart from ES's and the in-training validation's).

    Why: on seed-50x200 the CPU profile's ranking switches between "never fill a node completely"
    and "fill completely" over a narrow band of the ``becomes_cpu_full`` weight (the ``cpu`` v5
    line search, ``docs/history/bench-learned-diary.md``); inside it the Gini rises and failures fall
    smoothly with the weight. That band is many ES σ away from the start, where a local search sees a
    plateau; a 1-D scan finds it, and the fitness (failures, then a mean-Gini cap) picks the point on
    it. Returns the new search vector and one record per shift."""
    index = coordinate_index(coordinate)
    theta0 = net.search_vector(layers)
    base = NumpyPlacementNet(net)
    batch = [episodes(first + i) for i in range(n_episodes)]
    records: list[dict[str, Any]] = []
    best_theta, best_fitness = theta0, -np.inf
    for delta in sorted({0.0, *map(float, deltas)}):
        theta = theta0.copy()
        theta[index] += delta
        fast = base.with_search_vector(theta, layers)
        results = [rollout(fast, ep, reward=reward) for ep in batch]
        fitness = batch_fitness(results, mean_cap)
        arrived = sum(r.n_arrived for r in results)
        records.append({"delta": delta, "fitness": fitness,
                        "failure_pct": 100.0 * sum(r.n_failed for r in results) / max(arrived, 1),
                        "mean_gini": 100.0 * float(np.mean([r.fragmentation for r in results])),
                        "allocation_pct": 100.0 * float(np.mean([r.allocation for r in results]))})
        # Strictly better only: ties keep the smaller shift (visited first).
        if fitness > best_fitness:
            best_theta, best_fitness = theta, fitness
    return best_theta, records


def _start_network(episodes: EpisodeFactory, *, teacher: str, bc_episodes: int, bc_every: int, bc_epochs: int,
                   hidden: int, bc_parts: Sequence[str], bc_learning_rates: Sequence[float], seed: int,
                   init: PlacementNet | None, residual_bound: float | None, zero_correction: bool,
                   gate_unused: bool | None, gate_gpu_pods: bool | None) -> tuple[PlacementNet, dict[str, Any]]:
    """The search's start (stage 1 of :func:`train_profile`): a copy of ``init``, or a network
    imitating ``teacher`` (``bc_parts`` in order), with the residual's settings applied; and the
    imitation's log."""
    t0 = time.perf_counter()
    bc_log: list[dict[str, Any]] = []
    n_samples = 0
    if init is not None:
        net = copy.deepcopy(init)
    else:
        # Imitation episodes come from the far end of the factory's index range, apart from ES's.
        buffer = imitation.collect([episodes(1_000_000 + i) for i in range(bc_episodes)], teacher=teacher,
                                   every=bc_every, seed=seed)
        n_samples = len(buffer)
        net = PlacementNet(hidden=hidden, **({} if residual_bound is None else {"residual_bound": residual_bound}))
        for part, lr in zip(bc_parts, bc_learning_rates, strict=True):
            for record in imitation.behaviour_cloning(net, buffer, epochs=bc_epochs, part=part, learning_rate=lr,
                                                      seed=seed):
                bc_log.append({**record, "part": part})
    if residual_bound is not None:
        net.residual_bound = residual_bound
    if gate_unused is not None:
        net.gate_unused = gate_unused
    if gate_gpu_pods is not None:
        net.gate_gpu_pods = gate_gpu_pods
    if zero_correction:
        net.zero_correction()
    return net, {"samples": n_samples, "epochs": bc_log, "wall_s": time.perf_counter() - t0,
                 "skipped_for_init": init is not None}


def _run_search(es: EvolutionStrategy, es_steps: int, es_max_seconds: float,
                on_progress: Callable[[str, int, int], None] | None) -> None:
    """ES generations until ``es_steps`` environment steps or ``es_max_seconds`` of wall time."""
    t1 = time.perf_counter()
    while es.steps < es_steps and time.perf_counter() - t1 < es_max_seconds:
        es.generation()
        if on_progress is not None:
            on_progress("es", min(es.steps, es_steps), es_steps)


def _validation_scores(net: PlacementNet, episodes: EpisodeFactory, thetas: dict[str, np.ndarray], *,
                       n_episodes: int, reward: RewardConfig | None, mean_cap: MeanFragmentationCap | None,
                       layers: Sequence[str]) -> dict[str, float]:
    """Each search vector's batch fitness on ``n_episodes`` training-distribution episodes that
    neither imitation nor the search used (indices 2,000,000+); 0 for each when there are none."""
    validation = [episodes(2_000_000 + i) for i in range(n_episodes)]
    scores = {}
    for name, theta in thetas.items():
        fast = NumpyPlacementNet(net).with_search_vector(theta, layers)
        scores[name] = batch_fitness([rollout(fast, ep, reward=reward) for ep in validation], mean_cap) \
            if validation else 0.0
    return scores


def _search_log(es: EvolutionStrategy, wall_s: float, *, search_features: Sequence[str] | None,
                search_layers: Sequence[str], line: tuple[str, Sequence[float], int] | None,
                line_log: list[dict[str, Any]], mean_cap: MeanFragmentationCap | None) -> dict[str, Any]:
    """The ``search`` entry of :func:`train_profile`'s log."""
    return {"generations": es.log.generations, "steps": es.steps, "wall_s": wall_s,
            "pairs": es.pairs, "sigma": es.sigma, "learning_rate": es.learning_rate,
            "episodes_per_eval": es.episodes_per_eval,
            "search_features": list(search_features) if search_features is not None else "all",
            "search_layers": list(search_layers),
            "line_search": None if line is None else {"coordinate": line[0], "episodes": line[2],
                                                      "shifts": line_log},
            "mean_fragmentation_cap": None if mean_cap is None else {"cap": mean_cap.cap,
                                                                     "over_cap": mean_cap.over_cap}}


@dataclass
class ProfileResult:
    net: PlacementNet
    log: dict[str, Any]


def train_profile(*, episodes: EpisodeFactory, teacher: str, reward: RewardConfig | None, bc_episodes: int,
                  bc_every: int, bc_epochs: int, es_steps: int, es_max_seconds: float, hidden: int = 16,
                  bc_parts: Sequence[str] = ("all",), bc_learning_rates: Sequence[float] = (3e-3,),
                  pairs: int = 6, sigma: float = 0.05, learning_rate: float = 0.02, episodes_per_eval: int = 1,
                  validation_episodes: int = 0, seed: int = 0, on_progress: Callable[[str, int, int], None] | None = None,
                  init: PlacementNet | None = None, residual_bound: float | None = None,
                  zero_correction: bool = False, search_features: Sequence[str] | None = None,
                  gate_unused: bool | None = None, gate_gpu_pods: bool | None = None,
                  search_layers: Sequence[str] = (),
                  mean_cap: MeanFragmentationCap | None = None,
                  line: tuple[str, Sequence[float], int] | None = None) -> ProfileResult:
    """Imitation of ``teacher`` on ``bc_episodes`` episodes, then ES until ``es_steps`` environment
    steps or ``es_max_seconds`` of wall time, whichever comes first.

    ``bc_parts``: the imitation stages in order, e.g. ``("head", "mlp")`` — a linear imitation
    first, then the MLP on the residual (see :func:`imitation.behaviour_cloning`); ``hidden`` 16
    keeps a decision's forward pass ≈ 0.1 ms on 1,213 nodes.

    ``init``: start the search from this network instead of imitation (fine-tuning an earlier
    checkpoint's profile); the validation then compares the search result with ``init``.

    ``zero_correction``: start the search from ``g ≡ 0`` — the residual policy is then FGD itself
    (the network keeps its normalisation and MLP, whose weight ``mlp_scale`` starts at 0), and the
    search result is kept only if it beats FGD on the validation episodes.
    ``search_features``: move only these head weights (:func:`search_mask`); ``None`` = the whole
    ``[head ‖ mlp_scale]``. ``search_layers``: MLP layers the search moves as well (all their weights).
    ``gate_unused``: empty nodes get a constant correction (:class:`~regional_scheduler.learned.policy.PlacementNet`).
    ``gate_gpu_pods``: pods that ask for a GPU get ``g ≡ 0`` during the search too, so the search only
    tunes where CPU-only pods go.
    ``mean_cap``: the search's fitness, and the in-training validation, constrain the mean final
    fragmentation of a batch (:class:`MeanFragmentationCap`).
    ``line``: ``(coordinate, deltas, episodes)`` — a :func:`line_search` before the policy search.
    ``residual_bound``: the correction's bound ``b`` (:func:`~regional_scheduler.learned.policy.residual_logits`).
    """
    set_random_seed(seed)
    torch.set_num_threads(1)  # one thread also makes torch's reductions deterministic
    net, imitation_log = _start_network(episodes, teacher=teacher, bc_episodes=bc_episodes, bc_every=bc_every,
                                        bc_epochs=bc_epochs, hidden=hidden, bc_parts=bc_parts,
                                        bc_learning_rates=bc_learning_rates, seed=seed, init=init,
                                        residual_bound=residual_bound, zero_correction=zero_correction,
                                        gate_unused=gate_unused, gate_gpu_pods=gate_gpu_pods)
    # The in-training validation compares the result with this start (before any line search).
    theta0 = net.search_vector(search_layers)
    line_log: list[dict[str, Any]] = []
    if line is not None:
        coordinate, deltas, n_line = line
        theta_line, line_log = line_search(net, episodes, coordinate=coordinate, deltas=deltas, n_episodes=n_line,
                                           reward=reward, mean_cap=mean_cap, layers=search_layers)
        net.set_search_vector(theta_line, search_layers)
    es = EvolutionStrategy(net, episodes, reward=reward, pairs=pairs, sigma=sigma, learning_rate=learning_rate,
                           episodes_per_eval=episodes_per_eval, seed=seed, active=search_mask(search_features),
                           layers=search_layers, mean_cap=mean_cap)
    t1 = time.perf_counter()
    _run_search(es, es_steps, es_max_seconds, on_progress)
    # Model selection on training-distribution episodes neither phase used: keep the search's
    # result only if it beats the imitation start there.
    scores = _validation_scores(net, episodes, {"imitation": theta0, "search": es.theta},
                                n_episodes=validation_episodes, reward=reward, mean_cap=mean_cap, layers=search_layers)
    kept = "search" if scores["search"] >= scores["imitation"] else "imitation"
    if kept == "search":
        net = es.finish()
    elif line is not None:
        net.set_search_vector(theta0, search_layers)  # undo the line search too
    start = "fgd" if zero_correction else ("init" if init is not None else "imitation")
    return ProfileResult(net, {
        "teacher": teacher,
        "imitation": imitation_log,
        "search": _search_log(es, time.perf_counter() - t1, search_features=search_features,
                              search_layers=search_layers, line=line, line_log=line_log, mean_cap=mean_cap),
        "validation": {"episodes": validation_episodes, "mean_return": scores, "kept": kept,
                       "start": start},  # "imitation" in mean_return/kept names the search's start
        "search_vector": net.search_vector(search_layers).tolist(),
    })
