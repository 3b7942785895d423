"""Question: does replaying the target workload before a run tell when the learned correction beats FGD?

Needs the future: the replays draw pods from the list of pods still to come (the benchmark's target
workload), which no live scheduler has, so it is an experiment and not a serving path; it is kept to
measure how much such knowledge would be worth against the served policy.

A learned correction that beats FGD on average can still lose on a particular workload. Given the
target workload and a simulator, :class:`ReplaySelectedPolicy` replays the workload ``replays`` times
on a copy of the cluster — pods drawn at random from the workload until their GPU request reaches the
cluster's free GPU capacity (CPU on a CPU-only cluster), the same draws for both — once with FGD and
once with the correction, and serves the correction only if it placed more GPU (CPU) on average;
otherwise FGD places every pod.

The draws use fixed seeds (:data:`REPLAY_SEED`), so the choice is a function of the workload and the
cluster, and it is memoised on them: ten seeds of one pod list pay for the replays once. Cost on the
1,213-node openb cluster: one replay is one FGD and one corrected run to 100 % of the GPU capacity, a
few seconds, paid in ``prepare``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import MILLI_GPU_PER_DEVICE, Pod
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned.serving import LearnedScorer
from regional_scheduler.policies.base import ScorePolicy, Scores, WorkloadAware
from regional_scheduler.policies.fgd import FgdPolicy
from regional_scheduler.policies.learned import LearnedPolicy

# Far from every benchmark's inflation seeds (openb 42–51, validation 5,000+ and 9,000+).
REPLAY_SEED = 7_000_000
_MEMO_SIZE = 16


@dataclass(frozen=True)
class ReplayResult:
    """What the replays found: per replay, the GPU (CPU) milli placed by the correction minus FGD's."""

    gains: tuple[float, ...]
    resource: str  # "gpu" or "cpu": what was counted

    @property
    def mean_gain(self) -> float:
        return float(np.mean(self.gains)) if self.gains else 0.0

    @property
    def keeps_correction(self) -> bool:
        """The correction serves only if it placed strictly more on average (a tie goes to FGD)."""
        return self.mean_gain > 0.0


def replay_arrivals(workload: Sequence[Pod], state: ClusterState, seed: int) -> list[Pod]:
    """Pods drawn with replacement from ``workload`` until their GPU request reaches the cluster's
    free GPU capacity (CPU request and capacity when the cluster or the workload has no GPU)."""
    if not workload:
        return []
    gpu = _counts_gpu(workload, state)
    need = np.array([p.requests.gpu_milli_total if gpu else p.requests.milli_cpu for p in workload], dtype=float)
    capacity = float(state.gpu_free_milli.sum()) if gpu else float(state.free_milli_cpu.sum())
    if capacity <= 0 or need.sum() <= 0:
        return []
    rng = np.random.default_rng(seed)
    # Enough draws in one go: the mean request bounds how many are needed, with room for its spread.
    count = int(np.ceil(capacity / need.mean() * 1.5)) + 16
    picks = rng.integers(len(workload), size=count)
    while need[picks].sum() < capacity:
        picks = np.concatenate([picks, rng.integers(len(workload), size=count)])
    last = int(np.searchsorted(np.cumsum(need[picks]), capacity))  # the draw that reaches the capacity
    return [workload[i] for i in picks[: last + 1]]


def _counts_gpu(workload: Sequence[Pod], state: ClusterState) -> bool:
    return int(state.gpu_count.sum()) > 0 and any(p.requests.gpu_milli_total > 0 for p in workload)


def _placed(state: ClusterState, gpu: bool) -> float:
    return (float(state.gpu_count.sum() * MILLI_GPU_PER_DEVICE - state.gpu_free_milli.sum()) if gpu
            else float(state.req_milli_cpu.sum()))


def _run(policy: ScorePolicy, state: ClusterState, workload: Sequence[Pod], arrivals: Sequence[Pod]) -> ClusterState:
    state = state.copy()
    scheduler = Scheduler(policy)
    scheduler.prepare(state, workload)
    for pod in arrivals:
        placement = scheduler.place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)
    return state


def replay(make_corrected: Callable[[], ScorePolicy], state: ClusterState, workload: Sequence[Pod],
           replays: int) -> ReplayResult:
    """FGD and the corrected policy (``make_corrected()``, a fresh one per replay) on ``replays``
    draws of ``workload`` from ``state``; nothing of ``state`` is changed."""
    gpu = _counts_gpu(workload, state)
    gains = []
    for r in range(replays):
        arrivals = replay_arrivals(workload, state, REPLAY_SEED + r)
        fgd = _placed(_run(FgdPolicy(), state, workload, arrivals), gpu)
        corrected = _placed(_run(make_corrected(), state, workload, arrivals), gpu)
        gains.append(corrected - fgd)
    return ReplayResult(tuple(gains), "gpu" if gpu else "cpu")


# State that no decision reads: cache bookkeeping and telemetry timestamps.
_NOT_DECIDING = frozenset({"index", "node_version", "last_seq", "last_seen_s"})
_memo: OrderedDict[bytes, ReplayResult] = OrderedDict()


def memoised_replay(key_extra: bytes, make_corrected: Callable[[], ScorePolicy], state: ClusterState,
                    workload: Sequence[Pod], replays: int) -> ReplayResult:
    """:func:`replay`, remembered for the last few (network, cluster, workload) it was asked about;
    ``key_extra`` identifies the network."""
    key = _digest(key_extra, state, workload, replays)
    if key in _memo:
        _memo.move_to_end(key)
        return _memo[key]
    result = _memo[key] = replay(make_corrected, state, workload, replays)
    while len(_memo) > _MEMO_SIZE:
        _memo.popitem(last=False)
    return result


def _digest(key_extra: bytes, state: ClusterState, workload: Sequence[Pod], replays: int) -> bytes:
    h = hashlib.blake2b(key_extra, digest_size=20)
    h.update(replays.to_bytes(4, "little"))
    for name, value in sorted(vars(state).items()):
        if name in _NOT_DECIDING:
            continue
        h.update(name.encode())
        h.update(np.ascontiguousarray(value).tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
    h.update(repr([p.model_dump(exclude={"name", "creation_time_s", "deletion_time_s"}) for p in workload]).encode())
    return h.digest()


class ReplaySelectedPolicy(WorkloadAware):
    """``learned``, served only where ``replays`` replays of the prepared workload show it placing more
    than FGD; FGD otherwise. Unprepared (a live scheduler), it is the learned policy unchanged."""

    def __init__(self, learned: LearnedPolicy, replays: int) -> None:
        if replays < 1:
            raise ValueError(f"replays must be >= 1, got {replays}")
        self.learned = learned
        self.replays = replays
        self.name = f"{learned.name}+replays{replays}"
        self.replay: ReplayResult | None = None
        self._fgd = FgdPolicy()

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        self.learned.prepare(state, workload)
        self._fgd.prepare(state, workload)
        scorer = self.learned.scorer
        self.replay = None
        if scorer is None or scorer.gated:
            return
        nets = scorer.nets
        self.replay = memoised_replay(_net_digest(scorer), lambda: LearnedScorer(nets), state, workload,
                                      self.replays)

    @property
    def left_to_fgd(self) -> bool:
        return self.replay is not None and not self.replay.keeps_correction

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        # Both see every pod, so the one not deciding keeps its window and caches current.
        fgd = self._fgd.score(state, pod, nodes)
        learned = self.learned.score(state, pod, nodes)
        return fgd if self.left_to_fgd else learned

    def observe_unschedulable(self, state: ClusterState, pod: Pod) -> None:
        self.learned.observe_unschedulable(state, pod)
        self._fgd.observe_unschedulable(state, pod)

    def run_counts(self) -> dict[str, float]:
        counts = self.learned.run_counts()
        counts["replays_chose_fgd"] = float(self.left_to_fgd)
        return counts


def _net_digest(scorer: LearnedScorer) -> bytes:
    h = hashlib.blake2b(scorer.profile.encode(), digest_size=20)
    h.update(repr(scorer.net.hyper_parameters()).encode())
    for value in scorer.net.state_dict().values():
        h.update(value.detach().numpy().tobytes())
    return h.digest()
