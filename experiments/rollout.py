"""A rollout (lookahead) teacher over FGD: Bertsekas' one-step policy improvement, truncated.

Question: how much GPU allocation could lookahead over FGD gain, with the future known (an upper
bound) or sampled from the workload (what an online scheduler could do)? The measurements:
``docs/history/bench-learned-diary.md``, "a rollout (lookahead) teacher"; on ``default``:
``docs/results-learned-placement.md``.

At each decision the teacher takes FGD's best-scored feasible nodes, groups them by their free
resources (tied nodes are mostly identical, and identical nodes give identical rollouts), and for
up to ``k`` distinct candidates simulates: place the pod there, then let FGD place the next
``horizon`` pods. Value of a candidate = GPU milli placed during the rollout − ``frag_weight`` ·
FGD's cluster fragmentation (milli-GPU) at the horizon. The best value wins; ties (and every
decision with one distinct candidate) keep FGD's own node, so ``horizon=0`` *is* FGD.

The future pods are either the trace's own next pods (``future="trace"``: clairvoyant, an upper
bound on what lookahead can gain) or ``samples`` draws from the target workload (``"sampled"``:
what a scheduler could do without knowing the future; the same draws for every candidate, so
candidates are compared on common random numbers).

Rollouts run on the live state and are undone with ``release`` (exact inverse of ``allocate``), so
FGD's per-node caches stay valid except on the few nodes a rollout touched — copying the state
would invalidate the whole cache and cost a cold pass over all nodes per step.

This is an experiment, not a serving policy: a decision costs
``k · samples · horizon`` FGD decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from meridian.cluster_state import ClusterState, Placement
from meridian.model import Pod
from regional_scheduler.filters import run_filters
from regional_scheduler.policies.fgd import FgdPolicy

NAME = "rollout"


def _placement(state: ClusterState, node: int, device: int, pod: Pod) -> Placement:
    """The scheduler's assign stage (``framework.Scheduler.schedule``) for a chosen node."""
    if device >= 0 and pod.requests.gpu_milli:
        return Placement(node, (device,), pod.requests.gpu_milli)
    return state.choose_devices(node, pod)


def node_signature(state: ClusterState, nodes: np.ndarray) -> np.ndarray:
    """One row per node of everything a placement depends on: free CPU and memory, GPU model and
    count, constraint group, and the free milli-GPU of its devices sorted (device order does not
    change which pods fit). Equal rows = interchangeable nodes."""
    gpu = np.sort(state.gpu_free_milli[nodes], axis=1)
    cols = [state.free_milli_cpu[nodes], state.free_memory_bytes[nodes], state.gpu_model_id[nodes],
            state.gpu_count[nodes], state.constraint_group[nodes]]
    return np.column_stack([np.stack(cols, axis=1), gpu])


@dataclass
class RolloutStats:
    decisions: int = 0
    rolled: int = 0  # decisions with ≥ 2 distinct candidates
    changed: int = 0  # decisions where the teacher left FGD's node
    rollout_steps: int = 0


@dataclass
class RolloutPolicy:
    """The teacher as a simulator policy (``prepare``/``place``).

    - ``horizon``: FGD decisions simulated after the candidate placement (0 → FGD).
    - ``k``: distinct candidates rolled out, best FGD score first (then node order).
    - ``score_slack``: candidates within this many points of FGD's best integer score (0 = FGD's
      exact ties only, what the v3 residual's bound can re-order).
    - ``future``: ``"trace"`` (the arrivals given to ``prepare_arrivals``) or ``"sampled"``.
    """

    horizon: int = 32
    k: int = 4
    score_slack: float = 0.0
    frag_weight: float = 1.0
    future: str = "trace"
    samples: int = 1
    seed: int = 0
    name: str = NAME
    stats: RolloutStats = field(default_factory=RolloutStats)

    def __post_init__(self) -> None:
        if self.future not in ("trace", "sampled"):
            raise ValueError(f"future must be 'trace' or 'sampled', not {self.future!r}")
        self.fgd = FgdPolicy()
        self._arrivals: Sequence[Pod] = ()
        self._workload: list[Pod] = []
        self._cursor = 0

    def prepare_arrivals(self, arrivals: Sequence[Pod]) -> None:
        """The arrival order the simulator will use (``future="trace"`` reads the next pods)."""
        self._arrivals = arrivals

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        self.fgd.prepare(state, workload)
        self._workload = list(workload)
        self._cursor = 0
        self.stats = RolloutStats()

    # ------------------------------------------------------------------ FGD as the base policy
    def _fgd_choice(self, state: ClusterState, pod: Pod) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Feasible nodes, FGD's integer scores and devices over them."""
        mask, _ = run_filters(state, pod)
        nodes = np.flatnonzero(mask)
        if nodes.size == 0:
            return nodes, np.zeros(0), np.zeros(0, dtype=np.int64)
        s = self.fgd.score(state, pod, nodes)
        return nodes, s.scores, s.devices

    def _fgd_place(self, state: ClusterState, pod: Pod) -> Placement | None:
        nodes, scores, devices = self._fgd_choice(state, pod)
        if nodes.size == 0:
            return None
        pick = int(np.argmax(scores))  # first in node order on ties, as the scheduler selects
        placement = _placement(state, int(nodes[pick]), int(devices[pick]), pod)
        state.allocate(pod, placement)
        return placement

    def _future(self) -> list[list[Pod]]:
        if self.future == "trace":
            start = self._cursor + 1
            return [list(self._arrivals[start:start + self.horizon])]
        # As many pods as the episode still has when its length is known (a full-horizon rollout
        # should not run past the read-out point), their identities drawn from the workload.
        n = min(self.horizon, len(self._arrivals) - self._cursor - 1) if self._arrivals else self.horizon
        rng = np.random.default_rng([self.seed, self._cursor])
        return [[self._workload[i] for i in rng.integers(len(self._workload), size=n)]
                for _ in range(self.samples)]

    def _value(self, state: ClusterState, pod: Pod, first: Placement, futures: list[list[Pod]]) -> float:
        """Mean over futures of (GPU milli placed − frag_weight · fragmentation at the horizon);
        the state is restored before returning."""
        total = 0.0
        for pods in futures:
            state.allocate(pod, first)
            done: list[tuple[Pod, Placement]] = [(pod, first)]
            placed = pod.requests.gpu_milli_total
            for p in pods:
                pl = self._fgd_place(state, p)
                self.stats.rollout_steps += 1
                if pl is not None:
                    done.append((p, pl))
                    placed += p.requests.gpu_milli_total
            frag = float(self.fgd.node_fragmentation(state).sum())
            for p, pl in reversed(done):
                state.release(p, pl)
            total += placed - self.frag_weight * frag
        return total / len(futures)

    # ------------------------------------------------------------------ the policy
    def candidates(self, state: ClusterState, nodes: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Positions (into ``nodes``) of up to ``k`` distinct candidates, FGD's choice first."""
        near = np.flatnonzero(scores >= scores.max() - self.score_slack)
        _, first = np.unique(node_signature(state, nodes[near]), axis=0, return_index=True)
        pos = near[first]
        # Best score first, then node order: position 0 is FGD's own choice.
        order = np.lexsort((pos, -scores[pos]))
        return pos[order][: self.k]

    def place(self, state: ClusterState, pod: Pod) -> Placement | None:
        self.stats.decisions += 1
        nodes, scores, devices = self._fgd_choice(state, pod)
        try:
            if nodes.size == 0:
                return None
            cand = (self.candidates(state, nodes, scores) if self.horizon > 0
                    else np.array([int(np.argmax(scores))]))
            if cand.size > 1:
                self.stats.rolled += 1
                futures = self._future()
                values = [self._value(state, pod, _placement(state, int(nodes[c]), int(devices[c]), pod), futures)
                          for c in cand]
                best = int(np.argmax(values))  # ties → the earliest, FGD's own choice first
                if values[best] > values[0]:
                    self.stats.changed += best != 0
                    cand = cand[best:]
            c = int(cand[0])
            return _placement(state, int(nodes[c]), int(devices[c]), pod)
        finally:
            self._cursor += 1


# ---------------------------------------------------------------------- the experiment
def validation_episode(j: int, node_fraction: float = 0.3) -> tuple[list, list[Pod], list[Pod]]:
    """Validation run ``j`` (``validation.py``: training lists only, same augmentation seed) on a
    random ``node_fraction`` of the nodes, its arrivals cut where the arrived GPU request reaches
    100 % of capacity (the benchmark's read-out point). Returns nodes, arrivals, workload."""
    from experiments.validation import LISTS, N_AUGMENTED
    from meridian.traces import openb
    from regional_scheduler.learned.augment import augmented_pod_list
    from regional_scheduler.learned.env import openb_episode

    all_nodes = openb.load_nodes()
    name = LISTS[j % len(LISTS)]
    pods = openb.load_pods(openb.openb_dir() / f"openb_pod_list_{name}.csv")
    pods, _ = augmented_pod_list(pods, all_nodes, 5_000_000 + j, p_augment=1.0 if j < N_AUGMENTED else 0.0)
    ep = openb_episode(pods, all_nodes, 5000 + j, node_fraction=node_fraction)
    return list(ep.nodes), cut_at_full(ep.nodes, ep.arrivals), list(ep.workload)


def list_episode(pod_list: str, seed: int, node_fraction: float) -> tuple[list, list[Pod], list[Pod]]:
    """The benchmark's protocol on a shared pod list as it is (``openb_pod_list_{pod_list}.csv``, no
    augmentation; held-out lists too, for measuring, never for choosing a design) on a random
    ``node_fraction`` of the nodes, cut at 100 % arrived GPU request. Returns nodes, arrivals, workload."""
    from meridian.traces import openb
    from regional_scheduler.learned.env import openb_episode

    pods = openb.load_pods(openb.openb_dir() / f"openb_pod_list_{pod_list}.csv")
    ep = openb_episode(pods, openb.load_nodes(), seed, node_fraction=node_fraction)
    return list(ep.nodes), cut_at_full(ep.nodes, ep.arrivals), list(ep.workload)


def cut_at_full(nodes: Sequence, arrivals: Sequence[Pod]) -> list[Pod]:
    """The arrivals up to and including the one whose GPU request crosses 100 % of the nodes' GPUs."""
    cap = sum(n.allocatable_resources.gpu for n in nodes) * 1000
    arrived = np.cumsum([p.requests.gpu_milli_total for p in arrivals])
    return list(arrivals[: int(np.searchsorted(arrived * 100, 100 * cap)) + 1])


def compare(j: int, policies: dict[str, object], node_fraction: float = 0.3,
            pod_list: str | None = None) -> dict[str, float]:
    """GPU allocation (%) at 100 % arrived of each policy on validation episode ``j``, or, with
    ``pod_list``, on that list's episode of seed ``j``."""
    from meridian.simulator import run_arrivals

    nodes, arrivals, workload = (list_episode(pod_list, j, node_fraction) if pod_list
                                 else validation_episode(j, node_fraction))
    out: dict[str, float] = {}
    for name, policy in policies.items():
        if isinstance(policy, RolloutPolicy):
            policy.prepare_arrivals(arrivals)
        r = run_arrivals(policy, nodes, arrivals, workload=workload, scenario="openb",  # type: ignore[arg-type]
                         seed=j if pod_list else 5000 + j)
        out[name] = r.curve[100]["gpu_alloc_pct"]
        out[name + "_s"] = r.wall_s
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m experiments.rollout --horizon 32 --k 4 --future trace --runs 0-9``:
    FGD and the teacher on the same validation episodes (30 % node subsets by default); with
    ``--pod-list default --runs 42-49`` on that shared list's episodes of seeds 42–49 instead, and with
    ``--learned`` the committed learned policy beside them."""
    import argparse
    import json

    from experiments.validation import seed_range
    from regional_scheduler.framework import Scheduler

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--horizon", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--future", choices=("trace", "sampled"), default="trace")
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--score-slack", type=float, default=0.0)
    ap.add_argument("--frag-weight", type=float, default=1.0)
    ap.add_argument("--node-fraction", type=float, default=0.3)
    ap.add_argument("--runs", default="0-9", help="validation runs FIRST-LAST (seeds with --pod-list)")
    ap.add_argument("--pod-list", default=None, help="a shared list's name (e.g. default) instead of the validation runs")
    ap.add_argument("--learned", action="store_true", help="also run the committed learned policy")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for j in seed_range(args.runs):
        teacher = RolloutPolicy(horizon=args.horizon, k=args.k, future=args.future, samples=args.samples,
                                score_slack=args.score_slack, frag_weight=args.frag_weight, seed=j)
        policies: dict[str, object] = {"fgd": Scheduler(FgdPolicy())}
        if args.learned:
            from regional_scheduler.bench_placement import bench_policy

            policies["learned"] = Scheduler(bench_policy("learned"))
        policies["rollout"] = teacher
        r = compare(j, policies, args.node_fraction, args.pod_list)
        r.update(j=j, delta=r["rollout"] - r["fgd"], changed=teacher.stats.changed, rolled=teacher.stats.rolled,
                 decisions=teacher.stats.decisions, rollout_steps=teacher.stats.rollout_steps)
        rows.append(r)
        print(r, flush=True)
    d = [r["delta"] for r in rows]
    print(f"fgd {np.mean([r['fgd'] for r in rows]):.2f}  rollout {np.mean([r['rollout'] for r in rows]):.2f}  "
          f"mean delta {np.mean(d):+.2f}  worst {min(d):+.2f}  rollout >= fgd {sum(x >= 0 for x in d)}/{len(d)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
