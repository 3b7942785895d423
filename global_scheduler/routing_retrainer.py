"""The routing tier's retrainer for continual learning: DAgger on the recent past the learning records hold.

It replays the records' inputs (each region's hourly carbon intensity and price, the workloads that arrived)
through the federation simulator and labels every decision with the hindsight teacher of
:mod:`global_scheduler.routing_training`. Hindsight is legitimate here: every record is of a window that has
already ended, so the carbon a workload met is known; for the last day, whose future the records do not
hold, the teacher sees the last day repeated (:func:`~global_scheduler.routing_lifecycle_sim.timeline_from_records`).

Only the most recent ``history_windows`` records are replayed: after a regime change the recent past is the
regime to learn, and a fine-tune of a few thousand decisions keeps a retrain within seconds. With a parent
the passes follow the parent's own decisions from the first (DAgger's roll-in by the learner), at a lower
step size; without one the first pass follows the teacher, as ``meridian train routing`` does.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from global_scheduler.federation_sim import FederationSim
from global_scheduler.routing.base import DEFER
from global_scheduler.routing.gnn_routing import GnnRouting
from global_scheduler.routing_lifecycle_sim import (
    LEAD_HOURS,
    federation_layout,
    sim_over,
    timeline_from_records,
)
from global_scheduler.routing_training import (
    BATCH_RESERVE,
    SHIELD_MARGIN,
    target_distribution,
    teacher_scores,
)
from gnn.buffers import DecisionBuffer, DecisionSample
from gnn.policy import GnnRoutingNet
from gnn.train import agreement, train_imitation
from meridian.lifecycle.records import LearningRecord
from meridian.lifecycle.tiers import TrainedModel
from meridian.seeding import set_random_seed
from meridian.traces import locate_traces


def collect_labelled(sim: FederationSim, net: GnnRoutingNet, buffer: DecisionBuffer, *, follow_teacher: bool,
                     first_hour: int = LEAD_HOURS, teacher_carbon: np.ndarray | None = None) -> int:
    """Run ``net`` over ``sim`` and add each decision from ``first_hour`` on, labelled by the teacher, to
    ``buffer``; returns how many. Earlier hours only fill the federation: their day-ahead forecast has no
    day of history yet, so they would teach the network features it never sees in service.
    ``teacher_carbon`` (regions × hours, as ``sim.carbon``): the grids the teacher judges by, when they are
    not the ones the network sees (a mislabelled regime, for the benchmark's sabotaged candidates)."""
    added = 0
    seen_carbon = sim.carbon

    def on_decision(sim_: FederationSim, p, feats, wf, feasible, choice: int) -> int:
        nonlocal added
        if feasible is None:
            return choice
        if teacher_carbon is not None:
            sim_.carbon = teacher_carbon
        try:
            scores = teacher_scores(sim_, feats, wf, feasible, p.w.tenant)
        finally:
            sim_.carbon = seen_carbon
        if not np.isfinite(scores).any():
            return choice
        target, mask = target_distribution(scores)
        if sim_.hour >= first_hour:
            buffer.add(DecisionSample(net.graph(feats, wf), target, mask))
            added += 1
        if follow_teacher:
            best = int(np.argmax(np.where(mask, scores, -np.inf)))
            return DEFER if best == feats.n else best
        return choice

    sim.run(GnnRouting(net=net), on_decision=on_decision)
    return added


@dataclass
class RoutingRetrainer:
    """Trains the GNN router from learning records (module docstring); deterministic for a seed.

    Keyword arguments: ``history_windows`` most recent records replayed; ``passes`` DAgger passes;
    ``epochs`` over the buffer after each pass; ``lr`` Adam step size from scratch, ``fine_tune_lr`` from a
    parent (smaller, so a fine-tune moves the parent rather than replaces it); ``teacher_contrast``:
    the teacher judges each region's grid at this multiple of its distance from the federation's mean grid
    while the network sees the true grids (1: the true regime; negative: a mirrored one, the dirtiest grid
    judged the cleanest; only the benchmark's sabotaged candidates set it).
    """

    traces_dir: Path | None = None
    history_windows: int = 72
    passes: int = 2
    epochs: int = 4
    lr: float = 3e-3
    fine_tune_lr: float = 1e-3
    teacher_contrast: float = 1.0

    def train(self, records: Sequence[LearningRecord], *, parent: Path | None, out: Path,
              seed: int) -> TrainedModel:
        if not records:
            raise ValueError("routing retrainer: no learning records to train from")
        started = time.perf_counter()
        layout = federation_layout(self.traces_dir or locate_traces().path)
        recent = sorted(records, key=lambda r: r.window)[-self.history_windows:]
        timeline = timeline_from_records(recent, layout)
        sim = sim_over(layout, timeline, 0, timeline.hours)
        set_random_seed(seed)
        torch.set_num_threads(1)
        net = GnnRoutingNet.load(parent) if parent is not None else GnnRoutingNet(meta={})
        buffer = DecisionBuffer()
        losses: list[float] = []
        first_hour = min(LEAD_HOURS, timeline.hours // 2)
        teacher_carbon = None
        if self.teacher_contrast != 1.0:
            mean = sim.carbon.mean(axis=0, keepdims=True)
            teacher_carbon = mean + self.teacher_contrast * (sim.carbon - mean)
        for it in range(self.passes):
            collect_labelled(sim, net, buffer, follow_teacher=parent is None and it == 0, first_hour=first_hour,
                             teacher_carbon=teacher_carbon)
            if len(buffer):
                losses = train_imitation(net, buffer, epochs=self.epochs, batch_size=128,
                                         lr=self.lr if parent is None else self.fine_tune_lr, seed=seed + it)
        metrics = {"samples": float(len(buffer)), "loss": float(losses[-1]) if losses else float("nan"),
                   "agreement": float(agreement(net, buffer)), "train_seconds": time.perf_counter() - started}
        parent_sha = hashlib.sha256(parent.read_bytes()).hexdigest() if parent is not None else ""
        net.meta = {}
        net.save(out, {"shield_margin": SHIELD_MARGIN, "batch_reserve": BATCH_RESERVE, "seed": seed,
                       "windows": [recent[0].window, recent[-1].window], "parent_sha256": parent_sha,
                       "samples": len(buffer), "trainer": "global_scheduler.routing_retrainer"})
        command = (f"RoutingRetrainer(history_windows={self.history_windows}, passes={self.passes}, "
                   f"epochs={self.epochs}).train(records[{recent[0].window}..{recent[-1].window}], "
                   f"parent={'sha256:' + parent_sha[:12] if parent_sha else None}, seed={seed})")
        return TrainedModel(out, command, metrics)
