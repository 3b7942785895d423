"""Training the GNN router on the federation simulator (``meridian train routing``).

Teacher: a *hindsight* one-step oracle that scores every feasible cluster (and "defer") with the
issue's reward, ``w_perf·R_perf + w_cost·R_cost + w_energy·R_energy + w_fair·R_fair``, using what a
live router cannot know: the realised carbon intensity over the workload's lifetime and over every
start hour up to its deadline.

* ``R_perf = 1 / (1 + v)``, ``v`` = latency-SLO violations this placement causes: the workload's own
  (if latency-sensitive) plus the running latency-sensitive workloads of that cluster whose SLO the
  raised utilisation breaks (M/M/1 at utilisation + ``margin``, the margin standing for arrivals to come).
* ``R_cost = 1 / (1 + waste)``, ``waste`` = CPU/memory imbalance of the cluster after placement
  (capacity stranded in one dimension).
* ``R_energy`` = carbon-intensity reduction against the federation mean now:
  ``(ī − i_c) / ī`` with ``i_c`` = PUE × mean realised intensity over the workload's first 24 h there.
* ``R_fair`` = improvement of the Gini coefficient of tenants' good-service ratios.

The GNN only sees decision-time features (intensity now, a day-ahead seasonal-naive forecast), so it
must learn *when* a cluster's hindsight value is predictable. Collection is DAgger (Ross et al., 2011):
the first pass follows the teacher, later passes follow the current GNN while the teacher labels
each state it visits. Training windows and regions never overlap the evaluation's (see ``gnn/README.md``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from global_scheduler.federation_sim import TRAIN_REGIONS, FederationConfig, FederationSim
from global_scheduler.routing.base import DEFER, can_defer
from global_scheduler.routing.gnn_routing import GnnRouting
from gnn.buffers import DecisionBuffer, DecisionSample
from gnn.features import ClusterFeatures, WorkloadFeatures, utilisation_after
from gnn.policy import GnnRoutingNet, set_random_seed
from gnn.train import agreement, train_imitation

MARGIN = 0.1  # utilisation head-room the teacher keeps for arrivals still to come
DEFER_GAIN = 0.05  # defer only when it improves the score by this much (avoid pointless waiting)
TEMPERATURE = 0.05  # softness of the teacher's distribution over its scores


def gini(x: np.ndarray) -> float:
    if x.size == 0 or x.sum() <= 0:
        return 0.0
    s = np.sort(x)
    n = s.size
    return float((2 * np.arange(1, n + 1) - n - 1) @ s / (n * s.sum()))


def teacher_scores(sim: FederationSim, feats: ClusterFeatures, wf: WorkloadFeatures, feasible: np.ndarray,
                   tenant: str) -> np.ndarray:
    """``(n + 1,)`` reward of each choice (``-inf`` where infeasible); the last entry is "defer"."""
    n = feats.n
    hour = sim.hour
    cfg = sim.cfg
    reg = feats.region_index
    util = utilisation_after(feats, wf)
    # R_perf: own violation + running latency-sensitive workloads pushed over their SLO.
    v = np.zeros(n)
    pushed_others = np.zeros(n)
    if wf.latency_slo_ms > 0 and wf.origin_region >= 0:
        lat = feats.rtt_ms[wf.origin_region, reg] + cfg.service_ms / np.maximum(1 - (util + MARGIN), 0.01)
        v += lat > wf.latency_slo_ms
    if sim.running:
        run = [r for r in sim.running if r["slo"] > 0 and not sim.outcome_bad.get(r["id"], False)]
        if run:
            rc = np.array([r["cluster"] for r in run])
            budget = np.array([r["slo"] - sim.rtt[r["origin"], sim.cluster_region[r["cluster"]]] for r in run])
            crit = 1 - cfg.service_ms / np.maximum(budget, 1e-3)
            pushed = crit[None, :] < (util[:, None] + MARGIN)
            pushed_others = (pushed & (rc[None, :] == np.arange(n)[:, None])).sum(axis=1).astype(np.float64)
    r_perf = 1 / (1 + v)
    # R_cost: imbalance after placement.
    cpu = 1 - (feats.free_milli_cpu - wf.replicas * wf.milli_cpu) / np.maximum(feats.alloc_milli_cpu, 1)
    mem = 1 - (feats.free_memory_bytes - wf.replicas * wf.memory_bytes) / np.maximum(feats.alloc_memory_bytes, 1)
    r_cost = 1 / (1 + np.abs(cpu - mem))
    # R_energy with hindsight over the first 24 h of the workload's life.
    life = int(min(max(1, math.ceil(wf.expected_duration_h)), 24))
    pue = feats.pue
    life_ci = sim.carbon[reg, hour:hour + life].mean(axis=1) * pue
    ref = float(feats.carbon_now.mean() * pue.mean()) or 1.0
    r_energy = np.clip((ref - life_ci) / ref, -1.0, 1.0)
    # R_fair: Gini of good-service ratios if this decision goes well vs badly for the tenant.
    t = sim.tenant_index[tenant]
    good, total = sim.tenant_good, sim.tenant_total
    ratio = np.divide(good + 1, total + 1)
    base = gini(ratio)
    ok_ratio, bad_ratio = ratio.copy(), ratio.copy()
    ok_ratio[t] = (good[t] + 2) / (total[t] + 2)
    bad_ratio[t] = (good[t] + 1) / (total[t] + 2)
    r_fair = np.where(v + pushed_others > 0, base - gini(bad_ratio), base - gini(ok_ratio)) * 10
    w = wf.weights
    score = w[0] * r_perf + w[1] * r_cost + w[2] * r_energy + w[3] * r_fair
    # Violations a placement causes to *other* workloads cost what each victim's own violation costs it
    # (its class's performance weight × the R_perf drop from 1 to 1/2), one by one: a batch job must
    # not buy carbon with other tenants' SLOs.
    score = score - cfg.weights_latency_sensitive[0] * 0.5 * pushed_others
    out = np.append(np.where(feasible, score, -np.inf), -np.inf)
    if can_defer(wf):
        horizon = int(min(math.floor(wf.deadline_hours), 24))
        starts = hour + 1 + np.arange(horizon)
        future = np.stack([sim.carbon[reg, s:s + life].mean(axis=1) for s in starts]) * pue  # (H, n)
        allowed = feasible if feasible.any() else feats.ready
        best_future = float(np.where(allowed[None, :], future, np.inf).min())
        r_energy_defer = float(np.clip((ref - best_future) / ref, -1.0, 1.0))
        best_now = float(np.max(np.where(feasible, score, -np.inf))) if feasible.any() else -np.inf
        defer_score = w[0] * 1.0 + w[1] * float(r_cost.max()) + w[2] * r_energy_defer + w[3] * (base - gini(ok_ratio)) * 10
        if defer_score > best_now + DEFER_GAIN:
            out[n] = defer_score
        elif not feasible.any():
            out[n] = 0.0
    return out


def target_distribution(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mask = np.isfinite(scores)
    z = np.where(mask, scores / TEMPERATURE, -np.inf)
    z = z - z[mask].max()
    p = np.where(mask, np.exp(z), 0.0)
    return (p / p.sum()).astype(np.float32), mask


@dataclass
class TrainConfig:
    """``meridian train routing`` settings."""

    iterations: int = 3  # DAgger passes (the first follows the teacher)
    episodes_per_iteration: int = 4
    days: int = 4  # length of each training window
    clusters: int = 12
    epochs: int = 4
    batch_size: int = 128
    lr: float = 3e-3
    seed: int = 0
    layers: int = 1  # GATv2 layers (decision latency grows ~0.3-0.5 ms per layer at 100 clusters)
    years: tuple[int, ...] = (2021, 2022)  # Electricity Maps years used for training (2023 is held back)
    months: tuple[int, ...] = tuple(range(1, 11))  # January-October (December is held back)
    trace_days: tuple[float, float] = (0.0, 18.0)  # DLRM trace days used (days 23+ are held back)
    regions: tuple[str, ...] = TRAIN_REGIONS
    extra_meta: dict[str, str] = field(default_factory=dict)


def episode_config(tc: TrainConfig, rng: np.random.Generator) -> FederationConfig:
    year = int(rng.choice(tc.years))
    month = int(rng.choice(tc.months))
    day = int(rng.integers(1, 28 - tc.days))
    em_years = {"eu-north": year, "us-west": year, "sa-east": year}
    return FederationConfig(regions=tc.regions, region_years={r: y for r, y in em_years.items() if r in tc.regions},
                            clusters=tc.clusters, start=f"{month:02d}-{day:02d}", days=tc.days,
                            trace_offset_days=float(rng.uniform(*tc.trace_days)), seed=int(rng.integers(1 << 30)),
                            target_peak_utilisation=float(rng.uniform(0.45, 0.7)))


def collect(sim: FederationSim, net: GnnRoutingNet, buffer: DecisionBuffer, *, follow_teacher: bool) -> int:
    """Run one episode, labelling every visited decision with the teacher; returns samples added."""
    added = 0

    def on_decision(sim_: FederationSim, p, feats: ClusterFeatures, wf: WorkloadFeatures, feasible, choice: int) -> int:
        nonlocal added
        if feasible is None:
            return choice
        scores = teacher_scores(sim_, feats, wf, feasible, p.w.tenant)
        target, mask = target_distribution(scores) if np.isfinite(scores).any() else (None, None)
        if target is None:
            return choice
        buffer.add(DecisionSample(net.graph(feats, wf), target, mask))
        added += 1
        if follow_teacher:
            best = int(np.argmax(np.where(mask, scores, -np.inf)))
            return DEFER if best == feats.n else best
        return choice

    policy = GnnRouting(net=net)
    sim.run(policy, on_decision=on_decision)
    return added


def train_routing(tc: TrainConfig, traces_dir: Path, out: Path,
                  progress: Callable[[str, float], None] | None = None) -> dict[str, object]:
    """DAgger over simulated episodes; writes the checkpoint to ``out`` and returns a summary."""
    set_random_seed(tc.seed)
    rng = np.random.default_rng(tc.seed)
    net = GnnRoutingNet(layers=tc.layers, meta={})
    buffer = DecisionBuffer()
    started = time.time()
    history: list[dict[str, float]] = []
    total_steps = tc.iterations * tc.episodes_per_iteration
    step = 0
    for it in range(tc.iterations):
        for _ in range(tc.episodes_per_iteration):
            sim = FederationSim(episode_config(tc, rng), traces_dir)
            collect(sim, net, buffer, follow_teacher=(it == 0))
            step += 1
            if progress is not None:
                progress(f"iteration {it + 1}: collected {len(buffer)} decisions", step / (total_steps + tc.iterations))
        losses = train_imitation(net, buffer, epochs=tc.epochs, batch_size=tc.batch_size, lr=tc.lr, seed=tc.seed + it)
        history.append({"iteration": it + 1, "samples": len(buffer), "loss": losses[-1],
                        "agreement": agreement(net, buffer)})
        if progress is not None:
            progress(f"iteration {it + 1}: loss {losses[-1]:.3f}", (step + it + 1) / (total_steps + tc.iterations))
    meta = {
        "trained_at_unix_s": int(time.time()), "train_seconds": round(time.time() - started, 1),
        "regions": list(tc.regions), "years": list(tc.years), "months": list(tc.months),
        "trace_days": list(tc.trace_days), "iterations": tc.iterations,
        "episodes_per_iteration": tc.episodes_per_iteration, "days": tc.days, "clusters": tc.clusters,
        "seed": tc.seed, "layers": tc.layers, "history": history, **tc.extra_meta,
    }
    net.save(out, meta)
    return meta
