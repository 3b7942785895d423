"""How much of a run's GPU allocation is its trajectory rather than its policy (docs/targets.md).

Question: how far can re-drawing one early tie-break move the read-out, i.e. which gains over FGD are
within trajectory noise and no online policy can count on?

FGD breaks exact ties by node order. :class:`OneTieFgd` re-draws a single early decision at random
among FGD's exact ties and lets FGD decide every other pod. The spread of the read-out over such
one-decision perturbations says how far picking, in hindsight, the best of several near-equal
trajectories can move GPU allocation at 100 % arrived. That is the kind of gain a clairvoyant
rollout finds by changing a handful of early decisions (``rollout.py``), and no online policy can
count on it. An experiment, not a serving policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from regional_scheduler.policies.base import Scores
from regional_scheduler.policies.fgd import FgdPolicy

NAME = "fgd-one-tie"


class OneTieFgd(FgdPolicy):
    """FGD, except that scored decision number ``at`` (0-based) takes a uniformly random one of the
    nodes tied at FGD's best integer score (jitter below 1 point cannot cross a score bin)."""

    name = NAME

    def __init__(self, at: int, seed: int) -> None:
        super().__init__()
        self.at = at
        self.rng = np.random.default_rng(seed)
        self._scored = 0

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        super().prepare(state, workload)
        self._scored = 0

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        s = super().score(state, pod, nodes)
        here, self._scored = self._scored, self._scored + 1
        if here != self.at:
            return s
        return Scores(s.scores + self.rng.uniform(0.0, 0.5, size=s.scores.shape), s.devices)


class ProbeRow(BaseModel):
    seed: int
    gpus: float
    fgd: float
    perturbed: list[float]

    @property
    def best_gain(self) -> float:
        return max(self.perturbed) - self.fgd


def _allocation(policy: FgdPolicy, episode: tuple[list, list[Pod], list[Pod]], seed: int) -> float:
    from meridian.simulator import run_arrivals
    from regional_scheduler.framework import Scheduler

    nodes, arrivals, workload = episode
    r = run_arrivals(Scheduler(policy), nodes, arrivals, workload=workload, scenario="openb", seed=seed)
    return float(r.curve[100]["gpu_alloc_pct"])


def probe(pod_list: str, seed: int, *, node_fraction: float, perturbations: int,
          first_decisions: int = 64) -> ProbeRow:
    """FGD's GPU allocation (%) at 100 % arrived on one episode, and that of ``perturbations`` runs,
    each with one decision among the first ``first_decisions`` re-drawn among FGD's ties."""
    from experiments.rollout import list_episode

    episode = list_episode(pod_list, seed, node_fraction)
    draws = np.random.default_rng(seed).integers(first_decisions, size=perturbations)
    return ProbeRow(seed=seed, gpus=sum(n.allocatable_resources.gpu for n in episode[0]),
                    fgd=_allocation(FgdPolicy(), episode, seed),
                    perturbed=[_allocation(OneTieFgd(int(at), seed * 1000 + i), episode, seed)
                               for i, at in enumerate(draws)])


def main(argv: list[str] | None = None) -> None:
    """``python -m experiments.trajectory_probe --pod-list default --seeds 42-49
    --node-fraction 1.0 --perturbations 8``."""
    import argparse
    import json

    from experiments.validation import seed_range

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--pod-list", default="default")
    ap.add_argument("--seeds", default="42-49")
    ap.add_argument("--node-fraction", type=float, default=1.0)
    ap.add_argument("--perturbations", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for seed in seed_range(args.seeds):
        row = probe(args.pod_list, seed, node_fraction=args.node_fraction, perturbations=args.perturbations)
        rows.append(row)
        print(f"seed {seed}: fgd {row.fgd:.2f}  perturbed mean {np.mean(row.perturbed):.2f} "
              f"std {np.std(row.perturbed):.2f}  best {max(row.perturbed):.2f} ({row.best_gain:+.2f})", flush=True)
    print(f"mean over seeds: best-of-{args.perturbations} gain {np.mean([r.best_gain for r in rows]):+.3f} points, "
          f"spread (std) {np.mean([np.std(r.perturbed) for r in rows]):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.model_dump() for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
