"""``fgd``: Fragmentation Gradient Descent (Weng et al., USENIX ATC '23).

Each pod goes to the node — and, for a shared-GPU pod, the GPU device — that increases the
cluster's expected GPU fragmentation (:mod:`meridian.fragmentation`) the least. As in the paper's
simulator (``fgd_score.go``), the node score is ``int(sigmoid(Δ / 1000) · 100)`` with
``Δ = frag_before − frag_after`` in milli-GPU (the scoring math is :mod:`.fgd_score`; this module
keeps the target workload and the cache). The simulator breaks ties at random; the framework
takes the first node in order, without which the paper's figures are not reproduced
(:mod:`regional_scheduler.framework`).

Target workload: ``prepare(state, pods)`` gives it (the simulator passes the trace's pod list). A
live scheduler that was never prepared learns it online from the pods it is asked to place (the
last ``ONLINE_WINDOW`` shapes, looked at every ``ONLINE_REFRESH`` pods; a pod that fits no node counts
too, through ``observe_unschedulable``), so FGD works from the first
pod on a real cluster too. A new estimate replaces the old one only when the shape distribution has
moved by more than ``ONLINE_DRIFT`` (total variation), since two samples of one stationary stream
differ by sampling noise alone. Replacing it re-weights the cached per-type fragments (types new to
the estimate are computed for every node), which decides exactly as emptying every cache would, at a
fraction of the cold passes' cost.

Speed: fragmentation only changes on the node a pod lands on, so scores are cached per pod
shape and node and recomputed only for nodes whose ``node_version`` moved since (a placement
invalidates one node). A cold shape costs one vectorised pass over all nodes; `prepare` pays it
for every shape of the target workload up front.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.fragmentation import TargetWorkload, shape_key
from meridian.model import Pod
from regional_scheduler.policies.base import (
    ObservesUnschedulable,
    Scores,
    ScoresWithFragmentation,
    WorkloadAware,
)
from regional_scheduler.policies.fgd_score import after_per_type, fragments_now, node_score, weigh

NAME = "fgd"
ONLINE_WINDOW = 2000
ONLINE_REFRESH = 100
ONLINE_DRIFT = 0.02


@dataclass
class _Cache:
    version: np.ndarray
    values: np.ndarray
    devices: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Online mode only: the unweighted fragments behind ``values`` (``after_per_type``'s, or
    # ``fragment_per_type``'s for the per-node cache), one row per :class:`_Rows` row, so that a new
    # target workload re-weights them instead of recomputing every node; ``generation`` is the
    # estimate they were last weighted for; ``pod`` is the shape's representative.
    per_type: np.ndarray | None = None
    usable: np.ndarray | None = None
    pod: Pod | None = None
    generation: int = 0


@dataclass
class _Rows:
    """Online mode: which row of every cached per-type array holds which task type.

    A type keeps its row for as long as it stays in the estimate, so a new estimate moves no cached
    array (re-ordering every shape's ``(types × nodes × devices)`` array into the new type order made a
    re-weight 1.6× slower on ``default``, 86 vs 53 ms); a type that leaves frees its row for the next
    newcomer."""

    of_key: dict[tuple, int] = field(default_factory=dict)
    assigned: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # generation a row got its type
    weight: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the estimate's probability per row, 0 if free
    of_type: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # row of each type, in its order
    generation: int = 0

    @property
    def capacity(self) -> int:
        return int(self.assigned.size)

    def assign(self, workload: TargetWorkload) -> None:
        """Give every type of ``workload`` a row: its old one, or a freed or new one."""
        self.generation += 1
        keys = workload.type_keys()
        kept = {key: self.of_key[key] for key in keys if key in self.of_key}
        free = sorted(set(range(self.capacity)) - set(kept.values()), reverse=True)
        needed = len({key for key in keys if key not in kept}) - len(free)
        if needed > 0:
            free = list(range(self.capacity + needed - 1, self.capacity - 1, -1)) + free
            self.assigned = np.concatenate([self.assigned, np.zeros(needed, dtype=np.int64)])
        rows = []
        for key in keys:
            if key not in kept:
                kept[key] = free.pop()
                self.assigned[kept[key]] = self.generation
            rows.append(kept[key])
        self.of_key = kept
        self.of_type = np.array(rows, dtype=np.int64)
        self.weight = np.zeros(self.capacity)
        # Two shapes can be one type ('V100M16|V100M32' and 'V100M16|V100M32|V100M32' in gpuspec25, or two
        # models the cluster lacks): one row, both weights.
        np.add.at(self.weight, self.of_type, workload.probability)

    def new_since(self, generation: int) -> np.ndarray:
        """The workload's types (indices in its order) whose rows were given out after ``generation``."""
        return np.flatnonzero(self.assigned[self.of_type] > generation)


class FgdPolicy(WorkloadAware, ObservesUnschedulable, ScoresWithFragmentation):
    name = NAME

    def __init__(self, workload: TargetWorkload | None = None) -> None:
        self.workload = workload
        self._state: ClusterState | None = None
        self._frag: _Cache | None = None
        self._by_shape: dict[tuple, _Cache] = {}
        self._rows = _Rows()
        self._seen: deque[Pod] | None = None if workload is not None else deque(maxlen=ONLINE_WINDOW)
        self._window_counts: Counter[tuple] = Counter()  # the window's pods per shape_key, kept as it slides
        self._since_refresh = 0
        self.online_rebuilds = 0  # how often the online target workload replaced the previous one

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        """Fix the target workload and fill the score cache for each of its pod shapes, so that no
        decision pays a cold pass over every node (8–10 ms for a shared-GPU shape on 1,213 nodes).
        Decisions do not depend on the cache (deltas are quantised), only their latency does."""
        self.workload = TargetWorkload.from_pods(workload, state.gpu_models)
        self._seen = None
        self._state = None
        every_node = np.arange(state.n_nodes)
        for pod in _one_pod_per_cache_key(workload).values():
            self.delta(state, pod, every_node)

    def observe_unschedulable(self, state: ClusterState, pod: Pod) -> None:
        """A pod that fits no node arrived: it belongs to the online window like any scored pod. It
        does not count towards the next look at the window, which only scored pods need."""
        self._observe(state, pod, scored=False)

    def _observe(self, state: ClusterState, pod: Pod, *, scored: bool = True) -> None:
        """Online target workload for an unprepared (live) scheduler. The same pod seen twice in a
        row (the learned policy's fallback right after its own scorer) is counted once."""
        if self._seen is None or (self._seen and self._seen[-1] is pod):
            return
        if len(self._seen) == self._seen.maxlen:
            evicted = shape_key(self._seen[0])
            self._window_counts[evicted] -= 1
            if not self._window_counts[evicted]:
                del self._window_counts[evicted]
        self._seen.append(pod)
        self._window_counts[shape_key(pod)] += 1
        if not scored:
            return
        self._since_refresh += 1
        if self.workload is None or self._since_refresh >= ONLINE_REFRESH:
            self._since_refresh = 0
            fresh = TargetWorkload.from_counts(self._window_counts, state.gpu_models)
            if self.workload is None or fresh.distance(self.workload) > ONLINE_DRIFT:
                old, self.workload = self.workload, fresh
                self.online_rebuilds += 1
                if old is not None and self._state is state:
                    self._reweight(state)
                self._warm_window_shapes(state)

    def _warm_window_shapes(self, state: ClusterState) -> None:
        """Fill the cache for every pod shape of the window not cached yet. This decision is slow
        already (a new estimate), so the cold pass each shape would cost its first decision is
        taken here instead; decisions do not depend on the cache."""
        assert self._seen is not None
        every_node = np.arange(state.n_nodes)
        cached = self._by_shape if self._state is state else {}
        for key, pod in _one_pod_per_cache_key(self._seen).items():
            if key not in cached:
                self.delta(state, pod, every_node)

    def _reweight(self, state: ClusterState) -> None:
        """Take a new target workload without emptying the caches: types both estimates have keep
        their rows, and every cache is re-weighted now. (Re-weighting each shape's cache at its next
        use instead cut the slowest decisions, 205 → 20 ms on ``default``, but made ~1,000 more
        decisions per run cost 1–5 ms: a worse p99, and more over a 5 ms budget on ``gpuspec25``.)"""
        assert self.workload is not None and self._frag is not None
        self._rows.assign(self.workload)
        self._refresh(state, self._frag, None)
        for cache in self._by_shape.values():
            self._refresh(state, cache, cache.pod)

    def _refresh(self, state: ClusterState, cache: _Cache, pod: Pod | None) -> None:
        """Bring a cache weighted for an older estimate to the present one: the rows of types new
        since then are computed for every node the cache holds up to date (``(new types × nodes)``
        work, not a cold pass over all types), then every row is re-weighted. ``pod`` is None for
        the per-node fragmentation cache."""
        assert self.workload is not None and cache.per_type is not None
        rows = self._rows
        if cache.per_type.shape[0] < rows.capacity:
            grown = np.zeros((rows.capacity, *cache.per_type.shape[1:]))
            grown[: cache.per_type.shape[0]] = cache.per_type
            cache.per_type = grown
        new = rows.new_since(cache.generation)
        current = np.flatnonzero(cache.version == state.node_version)
        if new.size and current.size:
            added = self.workload.select(new)
            fresh = (fragments_now(state, current, added) if pod is None
                     else after_per_type(state, pod, current, added)[0])
            cache.per_type[np.ix_(rows.of_type[new], current)] = fresh
        cache.generation = rows.generation
        if pod is None:
            cache.values = rows.weight @ cache.per_type
        else:
            assert self._frag is not None
            cache.values, cache.devices = weigh(rows.weight, cache.per_type, cache.usable, self._frag.values)

    def _sync(self, state: ClusterState) -> None:
        if self.workload is None:
            raise RuntimeError("FGD needs a target workload: call prepare(state, pods) first")
        if self._state is not state or self._frag is None or self._frag.version.size != state.n_nodes:
            n = state.n_nodes
            self._state = state
            self._frag = _Cache(np.full(n, -1, dtype=np.int64), np.zeros(n))
            if self._online:
                self._rows = _Rows()
                self._rows.assign(self.workload)
                self._frag.per_type = np.zeros((self._rows.capacity, n))
                self._frag.generation = self._rows.generation
            self._by_shape = {}
        stale = np.flatnonzero(self._frag.version != state.node_version)
        if stale.size:
            per_type = fragments_now(state, stale, self.workload)
            if self._frag.per_type is not None:
                self._frag.per_type[np.ix_(self._rows.of_type, stale)] = per_type
            self._frag.values[stale] = self.workload.probability @ per_type
            self._frag.version[stale] = state.node_version[stale]

    @property
    def _online(self) -> bool:
        return self._seen is not None

    @property
    def online_window(self) -> Sequence[Pod] | None:
        """The recent pods the online target workload is estimated from; None once prepared."""
        return self._seen

    def node_fragmentation(self, state: ClusterState) -> np.ndarray:
        """Current per-node fragmentation in milli-GPU (cached)."""
        self._sync(state)
        assert self._frag is not None
        return self._frag.values

    def delta(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fragmentation increase and chosen device per candidate node (cached per pod shape)."""
        self._sync(state)
        assert self._frag is not None and self.workload is not None
        r = pod.requests
        key = _cache_key(pod)
        cache = self._by_shape.get(key)
        if cache is None:
            n = state.n_nodes
            cache = _Cache(np.full(n, -1, dtype=np.int64), np.zeros(n), np.full(n, -1, dtype=np.int64))
            if self._online:
                devices = state.gpu_free_milli.shape[1]
                cache.pod = pod
                cache.generation = self._rows.generation
                cache.per_type = np.zeros((self._rows.capacity, n, devices) if r.gpu_milli else
                                          (self._rows.capacity, n))
                cache.usable = np.zeros((n, devices), dtype=bool) if r.gpu_milli else None
            self._by_shape[key] = cache
        stale = nodes[cache.version[nodes] != state.node_version[nodes]]
        if stale.size:
            per_type, usable = after_per_type(state, pod, stale, self.workload)
            if cache.per_type is not None:  # online: kept for re-weighting
                cache.per_type[np.ix_(self._rows.of_type, stale)] = per_type
                if usable is not None:
                    assert cache.usable is not None
                    cache.usable[stale] = usable
            d, dev = weigh(self.workload.probability, per_type, usable, self._frag.values[stale])
            cache.values[stale] = d
            cache.devices[stale] = dev
            cache.version[stale] = state.node_version[stale]
        return cache.values[nodes], cache.devices[nodes]

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        return self.score_with_delta(state, pod, nodes)[0]

    def score_with_delta(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[Scores, np.ndarray]:
        """:meth:`score` and the fragmentation increase it came from (the learned policy's feature)."""
        self._observe(state, pod)
        delta, device = self.delta(state, pod, nodes)
        return Scores(node_score(delta), device), delta


def _cache_key(pod: Pod) -> tuple[int, int, int]:
    """What a node's delta depends on besides the node: the pod's CPU and GPU request."""
    r = pod.requests
    return r.milli_cpu, r.gpu, r.gpu_milli


def _one_pod_per_cache_key(pods: Iterable[Pod]) -> dict[tuple[int, int, int], Pod]:
    return {_cache_key(p): p for p in pods}


def build() -> FgdPolicy:
    return FgdPolicy()
