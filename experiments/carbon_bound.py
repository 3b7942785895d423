"""A provable lower bound on the carbon of any routing policy on a federation window, by linear programming.

An experiment, not a routing path (it was ``meridian bench routing-bound``); run it as::

    python -m experiments.carbon_bound --json bench-out/routing-bound-heldout.json
    python -m experiments.carbon_bound --slo-ceilings --drops 0 --json bench-out/routing-bound-slo-heldout.json

``meridian bench routing`` compares policies on one :class:`~global_scheduler.federation_sim.FederationSim`
window. This module answers a different question: what is the least carbon that *any* policy could
emit on that window while running every workload? It builds a linear programme whose feasible set
contains every schedule such a policy can produce, and whose objective is at most the simulator's
carbon for that schedule; its optimum is therefore a lower bound (loose, since much is relaxed).

What the simulator accounts (``FederationSim.run``), and how the LP mirrors it
--------------------------------------------------------------------------------
* Hours ``h = 0 … H−1`` with ``H = days·24 + drain_hours``; nothing is accounted after ``H−1``. A
  workload started in hour ``s`` holds ``replicas × (milli-CPU, memory, GPUs)`` in hours
  ``s … s+D−1``, ``D = max(1, ceil(duration_h))`` (released at the start of hour ``s+D``); the part of
  its run past ``H−1`` emits nothing, and the LP counts it nowhere either.
* Carbon of cluster ``k`` in hour ``h`` = ``P_k,h`` (IT watts, summed over its nodes) × PUE × intensity
  of its region in that hour / 10⁶ (kg, one-hour interval). The LP's objective is the same sum over a
  variable ``P_k,h`` constrained to lie *below* the simulator's power (next section), so it can only
  be lower.
* Decision variables ``x[w, k, s] ∈ [0, 1]``: the fraction of workload ``w`` started on cluster ``k`` in
  hour ``s``, with ``Σ_k,s x = 1`` (every workload runs; with ``max_drops`` a variable
  ``d_w ∈ [0, 1]`` takes up the rest, ``Σ d_w ≤ max_drops``). A real schedule sets one ``x`` to 1.
* Start hours: from the arrival hour to the last hour the simulator still places it instead of
  failing it — ``arrival + max_pending_hours − 1`` for latency-sensitive work, ``deadline +
  max_pending_hours − 1`` for deferrable work (the simulator starts deferrable work up to that hour,
  counting a deadline miss, and fails it only then). ``late_starts=False`` ends at the deadline
  instead (for policies with no deadline miss). A deferrable workload whose failure hour would come
  after the run's end may be left unstarted without counting as a failure, so it may be dropped for free.
* Clusters: those the router's filter (``global_scheduler.routing.feasibility.feasible_mask``) can ever
  pass, whatever the load: the region allowed by residency, ``RTT(origin, region) + service_ms < SLO`` for
  latency-sensitive work (the RTT at zero utilisation: the utilisation-dependent SLO ceilings are
  dropped, which only enlarges the feasible set), and, because ``FederationSim._place`` puts every
  replica on one node, clusters whose *empty* nodes can hold all the replicas. A workload with no
  such cluster fails under every policy; it is left out and counted (``unplaceable``).
* Capacity: for each cluster, hour and resource, the summed requests ≤ the cluster's allocatable (the
  per-node packing is relaxed to the cluster total). Usage is tracked by a flow: ``U_k,h = U_k,h−1 +
  starts in h − ends in h``, so each ``x`` appears in two rows per resource however long it runs.

The power lower bound (``meridian.power_model`` through ``NodePowerModel.watts``)
---------------------------------------------------------------------------------
A node with host idle/max ``i``/``m`` W, ``C`` vCPUs, ``M`` GiB, ``G`` GPU slots of idle/max ``gi``/``gm``
W, carrying requested ``c`` vCPUs, ``μ`` GiB, ``g`` GPUs draws, when anything is on it,
``P = i + (m−i)(2u − u^r) + G·gi + g·(gm − gi)`` with ``u = c/C``, ``r = 1.4``; and 0 W when nothing is
on it (``power_off_empty_nodes``). Two facts:

1. ``2u − u^r ≥ u`` on ``[0, 1]`` (``u ≥ u^r`` for ``r > 1``), with equality at 0 and 1, so ``u`` is the
   tightest linear minorant through the origin of Fan's concave curve.
2. The node is on whenever any of ``c/C``, ``μ/M``, ``g/G`` is positive, and each is ≤ 1, so for any
   ``λ ≥ 0`` with ``λ_c + λ_m + λ_g ≤ 1``: ``1[on] ≥ λ_c·c/C + λ_m·μ/M + λ_g·g/G`` (both sides 0 when off).

Hence, with ``I = i + G·gi`` the node's on-power (host idle plus idle boards),

    P ≥ c·[(m − i) + λ_c·I]/C  +  μ·λ_m·I/M  +  g·[(gm − gi) + λ_g·I/G]

for every node and every such ``λ``. A convex combination of the three vertices' planes (``λ`` a unit
vector) is never above their maximum, so only the vertices are kept. Nodes of one shape and one GPU
model (a *node type*) have the same coefficients, so the sum over a cluster's nodes of one type obeys
the same planes in the type's summed usage. The LP splits each cluster's usage over its types
(``U_k = Σ_types V_j``, ``0 ≤ V_j ≤`` the type's allocatable) and charges each type
``Q_j,h ≥`` each of its planes; ``P_k,h = Σ_j Q_j,h``. Any real placement gives such a split (the usage
that landed on each type), so the LP's power is at most the simulator's, whatever node each replica
lands on. With ``power_off_empty_nodes = False`` every node draws ``I`` always: that constant is
added and the on-indicator term dropped.

SLO ceilings (optional, ``slo_ceilings=True``: a bound for the policies with no SLO violation)
-----------------------------------------------------------------------------------------------
In every accounted hour ``h`` the simulator checks each running latency-sensitive workload ``w`` (SLO > 0)
on cluster ``k`` — in its start hour too, since placement precedes the hour's check, and in each hour
``s … s+D−1`` it holds — against ``rtt + service / max(1 − ρ_k,h, 0.01) ≤ SLO``, with ``ρ_k,h`` the
maximum over CPU, memory and GPU of the cluster's summed requests over its allocatable: exactly
``U_k,h,r / cap_k,r`` of the LP. With ``a = SLO − rtt > service`` (the filter above): if
``service / a ≤ 0.01`` the clamp keeps every ``ρ`` within the SLO (no ceiling); otherwise the check
passes iff ``ρ ≤ θ_w,k = 1 − service / a`` (``slo_ceiling``). So a schedule with no violation has
``U_k,h,r ≤ cap_k,r · θ_w,k`` for every resource whenever ``w`` runs on ``k`` in ``h``.

Let ``z_w,k,h = Σ_{s ≤ h ≤ s+D−1} x[w, k, s]`` (1 if ``w`` runs on ``k`` in ``h``, else 0, in a real
schedule). The row ``U_k,h,r ≤ cap_k,r · (1 − (1 − θ_w,k) · z_w,k,h)`` is then the ceiling when
``z = 1`` and the capacity row when ``z = 0``: every real schedule without a violation satisfies it,
so the feasible set still contains all of them and the optimum still bounds their carbon. Fractional
schedules are cut (``z = ½`` leaves half of the headroom), which is why it tightens the bound.

To keep the LP small, workloads with the same ceiling on a cluster (same origin and SLO) share one
indicator ``y_k,θ,h ∈ [0, 1]``: ``z_w,k,h ≤ y_k,θ,h`` for each of them (a *link* row, one per
workload, cluster and hour it may run there) and ``U_k,h,r + cap_k,r (1 − θ) y_k,θ,h ≤ cap_k,r`` for each
resource the cluster has (a *cap* row). For fixed ``x`` and ``U`` a feasible ``y`` exists iff
``U ≤ cap (1 − (1 − θ) max_w z)``, i.e. iff every per-workload row above holds: the same LP bound with
one ``U`` row per (level, hour, resource) instead of one per (workload, hour, resource). A real schedule
sets ``y`` to 1 where a workload of that level runs, 0 elsewhere. Rows are added for the hours
``0 … H−1`` only (no check happens after the run).

What is relaxed (so the bound is loose, never wrong): fractional workloads (a workload may be split
across clusters and hours); per-node packing and the whole-workload-on-one-cluster rule; the
utilisation-dependent SLO unless ``slo_ceilings`` (a latency-sensitive workload may then sit on a full
cluster; with it, only fractionally); idle power of
nodes kept on by a small request (only the ``λ`` share of it is charged); the concavity of Fan's
curve (charged at its chord); the split of usage over node types (free per resource, and whole
nodes' on-power charged only by the fraction of a type's capacity in use). Nothing here reads
how any policy routes.

Solved with HiGHS (``scipy.optimize.linprog``, interior point with crossover by default); the optimum
is exact up to HiGHS's feasibility and optimality tolerances (≈1e-7 relative), far below the figures'
precision.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import typer
from rich.table import Table
from scipy.optimize import linprog

from global_scheduler.cli_common import (  # the window options and their error handling, shared with `bench routing`
    CARBON_OPT,
    CLUSTERS_OPT,
    DAYS_OPT,
    PRICES_OPT,
    SEED_OPT,
    START_OPT,
    TRACES_OPT,
    config_json,
    console,
    series_error,
    window,
)
from global_scheduler.federation_sim import FederationSim

GIB = 2**30
RESOURCES = ("cpu", "memory", "gpu")


# ---------------------------------------------------------------------------------------- power bound
#: The on-indicator weights kept: the simplex's vertices (a convex combination of their planes is never
#: above their maximum, so for nodes with identical coefficients the vertices lose nothing).
LAMBDAS = np.eye(3)


@dataclass(frozen=True)
class NodeTypes:
    """A cluster's nodes grouped by identical shape and power coefficients (one row per (cluster, type)).

    The planes: ``P_type ≥ coef[j, l] · (vCPU, GiB, GPUs held on the type's nodes)`` for each ``l``;
    ``cap[j]`` is the type's total allocatable in the same units.
    """

    cluster: np.ndarray  # (J,) cluster index
    count: np.ndarray  # (J,) nodes
    cap: np.ndarray  # (J, 3) vCPU, GiB, GPUs over the type's nodes
    coef: np.ndarray  # (J, L, 3) W per vCPU, per GiB, per GPU
    const: np.ndarray  # (K,) W drawn whatever the load (0 when empty nodes are powered off)


def node_types(sim: FederationSim) -> NodeTypes:
    """The planes of the module docstring, from the simulator's own node power coefficients."""
    pm = sim.node_power
    power_off = sim.cfg.power_off_empty_nodes
    alloc = pm.alloc.astype(np.float64)
    key = np.column_stack([sim.node_cluster, alloc, pm.host_idle_watts, pm.host_max_watts, pm.gpu_idle_watts,
                           pm.gpu_max_watts])
    uniq, inverse, count = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    first = np.zeros(len(uniq), dtype=np.int64)
    first[inverse[::-1]] = np.arange(len(key))[::-1]  # one representative node per type
    n = first
    vcpu, gib, slots = alloc[n, 0] / 1000.0, alloc[n, 1] / GIB, alloc[n, 2]
    on_w = pm.host_idle_watts[n] + slots * pm.gpu_idle_watts[n]  # host idle + idle boards
    host_slope = pm.host_max_watts[n] - pm.host_idle_watts[n]
    gpu_slope = pm.gpu_max_watts[n] - pm.gpu_idle_watts[n]
    lam = LAMBDAS if power_off else np.zeros((1, 3))  # always on: the on-power is the constant instead
    safe = np.maximum
    coef = np.stack([
        (host_slope[:, None] + lam[None, :, 0] * on_w[:, None]) / safe(vcpu, 1e-9)[:, None],
        lam[None, :, 1] * on_w[:, None] / safe(gib, 1e-9)[:, None],
        gpu_slope[:, None] + lam[None, :, 2] * on_w[:, None] / safe(slots, 1)[:, None],
    ], axis=2)  # (J, L, 3)
    # A type without a resource never holds a request for it (its capacity is 0): coefficient irrelevant.
    coef = np.where(np.stack([vcpu, gib, slots], axis=1)[:, None, :] > 0, coef, 0.0)
    cap = np.stack([vcpu, gib, slots], axis=1) * count[:, None]
    k = sim.cfg.clusters
    const = np.zeros(k)
    if not power_off:
        np.add.at(const, sim.node_cluster, pm.host_idle_watts + alloc[:, 2] * pm.gpu_idle_watts)
    return NodeTypes(uniq[:, 0].astype(np.int64), count, cap, coef, const)


# ---------------------------------------------------------------------------------------- workloads
@dataclass
class Options:
    """Where and when each workload may start (arrays over the window's workloads, in ``sim.workloads`` order)."""

    clusters: np.ndarray  # (W, K) bool
    earliest: np.ndarray  # (W,) hour
    latest: np.ndarray  # (W,) hour, inclusive
    duration: np.ndarray  # (W,) hours held
    need: np.ndarray  # (W, 3) replicas × (vCPU, GiB, GPUs)
    free_drop: np.ndarray  # (W,) bool: may stay unstarted without counting as a failure
    unplaceable: np.ndarray  # (W,) bool: no cluster can ever take it: every policy fails it


def workload_options(sim: FederationSim, *, late_starts: bool = True) -> Options:
    cfg = sim.cfg
    horizon = sim.hours + cfg.drain_hours
    ws = sim.workloads
    n_w, n_k = len(ws), cfg.clusters
    reg = sim.cluster_region
    per_replica = np.array([[p.w.milli_cpu, p.w.memory_bytes, p.w.gpu] for p in ws], dtype=np.int64).reshape(-1, 3)
    replicas = np.array([p.w.replicas for p in ws], dtype=np.int64)
    # Residency.
    allowed = np.ones((n_w, n_k), dtype=bool)
    for i, p in enumerate(ws):
        if p.allowed is not None:
            allowed[i] = p.allowed[reg]
    # The filter's SLO test at zero utilisation (strict, as in feasible_mask).
    origin = np.array([p.origin for p in ws], dtype=np.int64)
    slo = np.array([p.slo_ms for p in ws], dtype=np.float64)
    rtt = sim.rtt[origin][:, reg]  # (W, K)
    latency_ok = (slo[:, None] <= 0) | (origin[:, None] < 0) | (rtt + cfg.service_ms < slo[:, None])
    # FederationSim._place puts each replica whole on one node: count how many fit on the empty nodes.
    alloc = sim.node_alloc.reshape(n_k, sim.per_cluster, 3)
    fits = np.zeros((n_w, n_k), dtype=bool)
    for i in range(n_w):
        need = per_replica[i]
        with np.errstate(divide="ignore"):
            per_node = np.where(need > 0, alloc // np.maximum(need, 1), np.iinfo(np.int64).max).min(axis=2)
        fits[i] = per_node.sum(axis=1) >= replicas[i]
    clusters = allowed & latency_ok & fits
    earliest = np.array([p.arrival_h for p in ws], dtype=np.int64)
    deadline = np.array([p.deadline_h for p in ws], dtype=np.float64)
    deferrable = np.array([p.deferrable for p in ws], dtype=bool)
    slack = max(cfg.max_pending_hours - 1, 0)
    # The simulator fails latency-sensitive work once it has waited max_pending_hours, deferrable work
    # at deadline + max_pending_hours; in between a deferrable start is late (a deadline miss), not failed.
    last_deferrable = np.floor(deadline + (slack if late_starts else 0)).astype(np.int64)
    latest = np.where(deferrable, last_deferrable, earliest + slack)
    # Deferrable work still queued when the run ends is not counted as failed.
    fail_hour = np.ceil(deadline + cfg.max_pending_hours).astype(np.int64)
    free_drop = deferrable & (fail_hour > horizon - 1)
    latest = np.minimum(np.maximum(latest, earliest), horizon - 1)
    duration = np.array([max(1, math.ceil(p.w.duration_h)) for p in ws], dtype=np.int64)
    need = per_replica.astype(np.float64) * replicas[:, None] / np.array([1000.0, GIB, 1.0])
    unplaceable = ~clusters.any(axis=1) | (earliest > horizon - 1)
    return Options(clusters, earliest, latest, duration, need, free_drop, unplaceable)


def _pinned(sim: FederationSim, opts: Options, schedule: dict[int, tuple[int, int]]) -> Options:
    ids = [p.w.id for p in sim.workloads]
    clusters = np.zeros_like(opts.clusters)
    earliest, latest = opts.earliest.copy(), opts.latest.copy()
    for i, wid in enumerate(ids):
        if wid in schedule:
            k, s = schedule[wid]
            clusters[i, k] = True
            earliest[i] = latest[i] = s
    return Options(clusters, earliest, latest, opts.duration, opts.need, np.zeros_like(opts.free_drop),
                   ~clusters.any(axis=1))


def slo_ceiling(sim: FederationSim) -> np.ndarray:
    """(W, K): the highest dominant-resource utilisation of cluster ``k`` at which workload ``w`` meets its SLO
    in the simulator's check, 1.0 where no utilisation can break it (no SLO, no origin, or the clamp).

    The simulator flags a violation when ``rtt + service / max(1 − ρ, 0.01) > slo``. With ``a = slo − rtt``:
    if ``service / a ≤ 0.01`` the left side never exceeds ``rtt + a`` (the clamp), so there is no ceiling;
    otherwise there is no violation iff ``1 − ρ ≥ service / a``, i.e. ``ρ ≤ 1 − service / a``
    (``meridian.routing_domain.crit_utilisation``; clipped at 0 where even an empty cluster is too far away).
    """
    cfg = sim.cfg
    ws = sim.workloads
    origin = np.array([p.origin for p in ws], dtype=np.int64)
    slo = np.array([p.slo_ms for p in ws], dtype=np.float64)
    has_slo = (slo > 0) & (origin >= 0)
    rtt = sim.rtt[np.maximum(origin, 0)][:, sim.cluster_region]  # (W, K); rows without an SLO are masked below
    slack = slo[:, None] - rtt
    ratio = cfg.service_ms / np.maximum(slack, 1e-9)
    binds = has_slo[:, None] & ((slack <= 0) | (ratio > 0.01))
    return np.where(binds, np.clip(1.0 - ratio, 0.0, 1.0), 1.0)


@dataclass
class CeilingRows:
    """The SLO-ceiling rows of the module docstring, as sparse triplets over the LP's columns.

    ``y`` columns are one per (cluster, ceiling level, hour) that some latency-sensitive start can reach:
    ``link`` rows ``Σ x − y ≤ 0`` (one per workload, cluster and hour it may run there) and ``cap`` rows
    ``U[k, h, r] + cap[k, r]·(1 − θ)·y ≤ cap[k, r]`` (one per such ``y`` and resource the cluster has).
    """

    n_y: int
    rows: np.ndarray  # row index within this block
    cols: np.ndarray  # column index, with y columns counted from y0
    vals: np.ndarray
    b: np.ndarray  # right-hand sides
    n_rows: int
    link_rows: int
    cap_rows: int
    levels: int  # distinct (cluster, ceiling) pairs


def _ceiling_rows(ceiling: np.ndarray, live: np.ndarray, wi: np.ndarray, xk: np.ndarray, xs: np.ndarray,
                  xe: np.ndarray, horizon: int, cap: np.ndarray, u_col: Callable[..., np.ndarray],
                  y0: int, below: float = 1.0) -> CeilingRows:
    n_k = cap.shape[0]
    theta = ceiling[live][wi, xk]  # per start variable
    # Any subset of the rows is valid; leaving out the loose ceilings only weakens the bound.
    sel = np.flatnonzero(theta < min(below, 1.0))
    # Levels: distinct (cluster, ceiling); workloads of one origin and SLO on one cluster share one.
    lev_key = np.stack([xk[sel].astype(np.float64), theta[sel]], axis=1)
    levels, lev_of = np.unique(lev_key, axis=0, return_inverse=True)
    lev_of = lev_of.ravel()
    # Each start variable x[w, k, s] runs there in hours s … min(s + D, H) − 1: the simulator checks
    # the SLO in every one of them, the start hour included (placement comes before the hour's check).
    length = np.minimum(xe[sel], horizon) - xs[sel]
    col = np.repeat(sel, length)
    first = np.repeat(np.cumsum(length) - length, length)
    hour = np.repeat(xs[sel], length) + (np.arange(int(length.sum())) - first)
    lev = np.repeat(lev_of, length)
    # One link row per (workload, cluster, hour): z[w, k, h] = Σ of its x covering h.
    link_key = (wi[col].astype(np.int64) * n_k + xk[col]) * horizon + hour
    link_keys, link_row = np.unique(link_key, return_inverse=True)
    link_row = link_row.ravel()
    n_link = len(link_keys)
    # The y of each link row: its workload's level at that hour.
    yk = lev * horizon + hour
    y_keys, y_idx = np.unique(yk, return_inverse=True)
    y_idx = y_idx.ravel()
    n_y = len(y_keys)
    row_y = np.zeros(n_link, dtype=np.int64)
    row_y[link_row] = y_idx  # every entry of a link row has the same (level, hour)
    rows = [link_row, np.arange(n_link)]
    cols = [col, y0 + row_y]
    vals = [np.ones(len(col)), -np.ones(n_link)]
    # Cap rows: per y and resource the cluster has (a resource it lacks is 0 in every schedule).
    y_lev, y_hour = y_keys // horizon, y_keys % horizon
    y_k = levels[y_lev, 0].astype(np.int64)
    y_theta = levels[y_lev, 1]
    n_cap = 0
    for r in range(3):
        has = np.flatnonzero(cap[y_k, r] > 0)
        rid = n_link + n_cap + np.arange(len(has))
        rows += [rid, rid]
        cols += [u_col(y_k[has], y_hour[has], r), y0 + has]
        vals += [np.ones(len(has)), cap[y_k[has], r] * (1.0 - y_theta[has])]
        n_cap += len(has)
    b = np.concatenate([np.zeros(n_link), *(cap[y_k[cap[y_k, r] > 0], r] for r in range(3))])
    return CeilingRows(n_y, np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), b, n_link + n_cap,
                       n_link, n_cap, len(levels))


# ---------------------------------------------------------------------------------------- the LP
@dataclass
class BoundResult:
    carbon_kg: float
    status: str
    max_drops: int
    dropped: float  # Σ d_w at the optimum (counted drops, not free ones)
    solve_s: float
    build_s: float
    variables: int
    constraints: int
    nonzeros: int
    workloads: int
    unplaceable: int
    free_drops: int
    late_starts: bool
    slo_ceilings: bool = False
    slo_rows: int = 0  # link + cap rows of the SLO ceilings (0 without them)
    slo_levels: int = 0  # distinct (cluster, ceiling) pairs
    slo_ceiling_below: float = 1.0  # only ceilings below this were added
    region_energy_kwh: dict[str, float] = field(default_factory=dict)  # facility kWh of the LP's power
    region_carbon_kg: dict[str, float] = field(default_factory=dict)
    region_vcpu_hours: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: a figure an LP without an optimum does not give (NaN here) is ``None`` (null), not NaN."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in self.__dict__.items()}


def carbon_lower_bound(sim: FederationSim, *, max_drops: int = 0, late_starts: bool = True,
                       method: str = "highs-ipm", schedule: dict[int, tuple[int, int]] | None = None,
                       slo_ceilings: bool = False, slo_ceiling_below: float = 1.0, progress: Callable[[str], None] | None = None) -> BoundResult:
    """Solve the LP of the module docstring on ``sim``'s window; ``carbon_kg`` is the lower bound.

    ``max_drops``: how many workloads (beyond those no policy can place) the schedule may leave
    unrun; 0 bounds the policies that fail no placeable workload. ``method``: HiGHS's interior point
    (with crossover) solves the week's LP in minutes where its dual simplex takes over ten times longer.
    ``schedule`` (workload id → (cluster, start hour), e.g. from
    :func:`~global_scheduler.bench_routing.policy_schedule`) pins every workload to one real schedule
    and leaves the others out: the optimum is then the power bound of
    that schedule alone, a check that must stay below the simulator's carbon for it.
    ``slo_ceilings`` adds the utilisation ceilings of latency-sensitive work (module docstring): the
    optimum then bounds only the policies with no SLO violation (and stays infeasible for a pinned
    ``schedule`` that breaks an SLO). ``slo_ceiling_below`` keeps only the ceilings below it (fewer
    rows, a weaker bound, still valid for the same policies).
    """
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    cfg = sim.cfg
    horizon = sim.hours + cfg.drain_hours
    n_k = cfg.clusters
    opts = workload_options(sim, late_starts=late_starts)
    if schedule is not None:
        opts = _pinned(sim, opts, schedule)
    types = node_types(sim)
    reg = sim.cluster_region
    pue = np.array([sim.regions[r].pue for r in reg])
    # kg per IT watt held for one hour in cluster k, hour h.
    coef = pue[:, None] * sim.carbon[reg, :horizon] / 1e6  # (K, H)

    live = np.flatnonzero(~opts.unplaceable)
    n_w = len(live)
    span = int((opts.latest[live] - opts.earliest[live]).max(initial=0)) + 1
    # Every (workload, cluster, start offset) triple at once: a boolean cube, then its non-zeros.
    offs = np.arange(span)
    in_window = offs[None, :] <= (opts.latest[live] - opts.earliest[live])[:, None]  # (W, S)
    cube = opts.clusters[live][:, :, None] & in_window[:, None, :]
    wi, xk, so = np.nonzero(cube)
    xs = opts.earliest[live][wi] + so
    xe = xs + opts.duration[live][wi]  # release hour (may be ≥ horizon: never released inside the run)
    n_x = len(wi)
    say(f"{n_w} workloads ({int(opts.unplaceable.sum())} unplaceable), {n_x:,} start variables, "
        f"{len(types.cluster)} (cluster, node type) pairs")

    # Column layout: x | U (K, H, 3) cluster usage | V (J, H, 3) usage per node type | Q (J, H) watts | d (W).
    n_j = len(types.cluster)
    n_u = n_k * horizon * 3
    n_v = n_j * horizon * 3
    n_q = n_j * horizon
    u0, v0 = n_x, n_x + n_u
    q0 = v0 + n_v
    d0 = q0 + n_q
    n_var = d0 + n_w

    def u_col(k: np.ndarray, h: np.ndarray, r: int | np.ndarray) -> np.ndarray:
        return u0 + (k * horizon + h) * 3 + r

    ceil = None
    if slo_ceilings:
        cap = sim.node_alloc.reshape(n_k, sim.per_cluster, 3).sum(axis=1) / np.array([1000.0, GIB, 1.0])
        ceil = _ceiling_rows(slo_ceiling(sim), live, wi, xk, xs, xe, horizon, cap, u_col, y0=n_var,
                             below=slo_ceiling_below)
        n_var += ceil.n_y
        say(f"SLO ceilings: {ceil.levels} (cluster, ceiling) levels, {ceil.n_y:,} indicator columns, "
            f"{ceil.link_rows:,} link rows + {ceil.cap_rows:,} cap rows")

    # --- equality rows: assignment (W), usage flow (K·H·3).
    rows, cols, vals = [], [], []
    rows.append(wi)
    cols.append(np.arange(n_x))
    vals.append(np.ones(n_x))
    rows.append(np.arange(n_w))
    cols.append(d0 + np.arange(n_w))
    vals.append(np.ones(n_w))
    flow0 = n_w
    kk, hh, rr = (a.ravel() for a in np.meshgrid(np.arange(n_k), np.arange(horizon), np.arange(3), indexing="ij"))
    flow_row = flow0 + (kk * horizon + hh) * 3 + rr
    rows.append(flow_row)
    cols.append(u_col(kk, hh, rr))
    vals.append(np.ones(len(kk)))
    has_prev = hh > 0
    rows.append(flow_row[has_prev])
    cols.append(u_col(kk[has_prev], hh[has_prev] - 1, rr[has_prev]))
    vals.append(-np.ones(int(has_prev.sum())))
    need = opts.need[live][wi]  # (n_x, 3)
    ends_inside = xe < horizon
    for r in range(3):
        nz = need[:, r] > 0
        rows.append(flow0 + (xk[nz] * horizon + xs[nz]) * 3 + r)
        cols.append(np.flatnonzero(nz))
        vals.append(-need[nz, r])
        e = nz & ends_inside
        rows.append(flow0 + (xk[e] * horizon + xe[e]) * 3 + r)
        cols.append(np.flatnonzero(e))
        vals.append(need[e, r])
    # U_k,h,r = Σ over the cluster's node types of V_j,h,r.
    split0 = flow0 + n_k * horizon * 3
    rows.append(split0 + (kk * horizon + hh) * 3 + rr)
    cols.append(u_col(kk, hh, rr))
    vals.append(np.ones(len(kk)))
    jj, vh, vr = (a.ravel() for a in np.meshgrid(np.arange(n_j), np.arange(horizon), np.arange(3), indexing="ij"))
    rows.append(split0 + (types.cluster[jj] * horizon + vh) * 3 + vr)
    cols.append(v0 + (jj * horizon + vh) * 3 + vr)
    vals.append(-np.ones(len(jj)))
    n_eq = split0 + n_k * horizon * 3
    a_eq = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_eq, n_var))
    b_eq = np.zeros(n_eq)
    b_eq[:n_w] = 1.0

    # --- inequality rows: power planes (per node type, vertex and hour), drop budget (1).
    n_l = types.coef.shape[1]
    # The GPU vertex of a type without GPUs is dominated by its CPU vertex: no row for it.
    useful = (types.coef.any(axis=2)) & ~((np.arange(n_l)[None, :] == 2) & (types.cap[:, 2:3] <= 0))
    pj, pl = np.nonzero(useful)
    pj, ph = np.repeat(pj, horizon), np.tile(np.arange(horizon), len(pl))
    pl = np.repeat(pl, horizon)
    plane_row = np.arange(len(pj))
    rows_u, cols_u, vals_u = [plane_row], [q0 + pj * horizon + ph], [-np.ones(len(pj))]
    for r in range(3):
        v = types.coef[pj, pl, r]
        nz = v > 0
        rows_u.append(plane_row[nz])
        cols_u.append(v0 + (pj[nz] * horizon + ph[nz]) * 3 + r)
        vals_u.append(v[nz])
    n_ub = len(pj)
    b_parts = [np.zeros(n_ub)]
    counted = ~opts.free_drop[live]
    if max_drops > 0 and counted.any():
        rows_u.append(np.full(int(counted.sum()), n_ub))
        cols_u.append(d0 + np.flatnonzero(counted))
        vals_u.append(np.ones(int(counted.sum())))
        b_parts.append(np.array([float(max_drops)]))
        n_ub += 1
    if ceil is not None:
        rows_u.append(n_ub + ceil.rows)
        cols_u.append(ceil.cols)
        vals_u.append(ceil.vals)
        b_parts.append(ceil.b)
        n_ub += ceil.n_rows
    a_ub = sp.csr_matrix((np.concatenate(vals_u), (np.concatenate(rows_u), np.concatenate(cols_u))),
                         shape=(n_ub, n_var))
    b_ub = np.concatenate(b_parts)

    # --- bounds and objective.
    ub = np.full(n_var, np.inf)
    ub[:n_x] = 1.0
    ub[v0:q0] = np.repeat(types.cap[:, None, :], horizon, axis=1).ravel()
    d_ub = np.where(opts.free_drop[live], 1.0, 1.0 if max_drops > 0 else 0.0)
    ub[d0:d0 + n_w] = d_ub
    ub[d0 + n_w:] = 1.0  # the SLO indicators y
    bounds = np.stack([np.zeros(n_var), ub], axis=1)
    c = np.zeros(n_var)
    c[q0:d0] = coef[types.cluster].ravel()
    constant = float((types.const[:, None] * coef).sum())
    build_s = time.perf_counter() - t0
    nnz = a_eq.nnz + a_ub.nnz
    say(f"LP: {n_var:,} variables, {n_eq + n_ub:,} constraints, {nnz:,} non-zeros (built in {build_s:.1f} s); solving…")

    t1 = time.perf_counter()
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method=method)
    solve_s = time.perf_counter() - t1
    say(f"HiGHS: {res.message} ({solve_s:.1f} s)")
    # "Optimization terminated successfully. (HiGHS Status 7: Optimal)" → "Optimal".
    status = str(res.message).rsplit(":", 1)[-1].strip(" )") if "Status" in str(res.message) else str(res.message)
    out = BoundResult(carbon_kg=math.nan, status=status, max_drops=max_drops, dropped=math.nan,
                      solve_s=solve_s, build_s=build_s, variables=n_var, constraints=n_eq + n_ub, nonzeros=nnz,
                      workloads=len(sim.workloads), unplaceable=int(opts.unplaceable.sum()),
                      free_drops=int(opts.free_drop[live].sum()), late_starts=late_starts,
                      slo_ceilings=slo_ceilings, slo_rows=ceil.n_rows if ceil else 0,
                      slo_levels=ceil.levels if ceil else 0, slo_ceiling_below=slo_ceiling_below)
    if res.status != 0:
        return out
    out.carbon_kg = float(res.fun) + constant
    out.dropped = float(res.x[d0:d0 + n_w][counted].sum())
    power = np.zeros((n_k, horizon))
    np.add.at(power, types.cluster, res.x[q0:d0].reshape(n_j, horizon))
    power += types.const[:, None]
    usage = res.x[u0:v0].reshape(n_k, horizon, 3)
    for k in range(n_k):
        name = sim.regions[reg[k]].name
        out.region_energy_kwh[name] = out.region_energy_kwh.get(name, 0.0) + float(power[k].sum() * pue[k] / 1000)
        out.region_carbon_kg[name] = out.region_carbon_kg.get(name, 0.0) + float((power[k] * coef[k]).sum())
        out.region_vcpu_hours[name] = out.region_vcpu_hours.get(name, 0.0) + float(usage[k, :, 0].sum())
    return out


# ---------------------------------------------------------------------------------------- the command
# ``python -m experiments.carbon_bound`` (formerly ``meridian bench routing-bound``): the same federation
# window options as ``meridian bench routing``, shared with it through global_scheduler.cli_common.
app = typer.Typer(add_completion=False, help=__doc__.partition("\n")[0])


@app.command()
def main(
    carbon: Path | None = CARBON_OPT,
    prices: Path | None = PRICES_OPT,
    start: str = START_OPT,
    days: int = DAYS_OPT,
    clusters: int = CLUSTERS_OPT,
    seed: int = SEED_OPT,
    drops: int = typer.Option(76, "--drops", min=0, help="Second bound: the LP may leave this many workloads "
                              "unrun (default: least-carbon's failures on the held-back window; 0 = skip)."),
    no_late_starts: bool = typer.Option(False, "--no-late-starts", help="Deferrable work starts by its deadline "
                                        "(bounds policies with no deadline miss; default: by the simulator's "
                                        "failure hour, as any 0-failure policy may)."),
    slo_ceilings: bool = typer.Option(False, "--slo-ceilings/--no-slo-ceilings",
                                      help="Add the utilisation ceilings of latency-sensitive work: the bound "
                                           "then holds only for policies with no SLO violation (tighter)."),
    slo_ceiling_below: float = typer.Option(1.0, "--slo-ceiling-below", min=0.0, max=1.0,
                                            help="With --slo-ceilings: add only ceilings below this utilisation "
                                                 "(fewer rows, a weaker bound, still valid)."),
    traces: Path | None = TRACES_OPT,
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON here."),
) -> None:
    """A lower bound (LP relaxation) on the carbon of ANY policy that runs every workload of the window
    (with --slo-ceilings: of any policy that also breaks no latency SLO)."""
    cfg, traces_dir = window(start=start, days=days, clusters=clusters, seed=seed, traces=traces,
                              carbon=carbon, prices=prices)
    try:
        sim = FederationSim(cfg, traces_dir, carbon_dir=carbon, prices_file=prices)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    except KeyError as exc:
        raise series_error(exc) from None
    results = {}
    for max_drops in ((0, drops) if drops else (0,)):
        console.print(f"[bold]bound with up to {max_drops} dropped workloads[/bold]")
        results[f"drops_{max_drops}"] = carbon_lower_bound(sim, max_drops=max_drops,
                                                           late_starts=not no_late_starts,
                                                           slo_ceilings=slo_ceilings,
                                                           slo_ceiling_below=slo_ceiling_below,
                                                           progress=lambda msg: console.print(f"  {msg}"))
    which = ("policies with no SLO violation (SLO ceilings on"
             + (f", those below {slo_ceiling_below:g})" if slo_ceiling_below < 1 else ")") if slo_ceilings
             else "any policy (SLO ceilings off)")
    which += ", no deadline miss" if no_late_starts else ""
    table = Table(title=f"carbon lower bound for {which}: {cfg.clusters} clusters in {len(cfg.regions)} regions, {cfg.days} "
                  f"days from {cfg.start} (+{cfg.drain_hours} h drain), {len(sim.workloads)} workloads")
    for col in ("may drop", "bound kg", "dropped", "unplaceable", "variables", "solve s", "status"):
        table.add_column(col, justify="right")
    for r in results.values():
        table.add_row(str(r.max_drops), f"{r.carbon_kg:,.1f}", f"{r.dropped:.1f}", str(r.unplaceable),
                      f"{r.variables:,}", f"{r.solve_s:.1f}", r.status)
    console.print(table)
    first = results["drops_0"]
    regions = Table(title="where the bound's schedule puts the work (may drop 0)")
    for col in ("region", "kWh", "kg", "vCPU-h", *(f"kg, may drop {drops}",) * (len(results) > 1)):
        regions.add_column(col, justify="right")
    for name in first.region_energy_kwh:
        extra = [f"{r.region_carbon_kg.get(name, 0):,.0f}" for key, r in results.items() if key != "drops_0"]
        regions.add_row(name, f"{first.region_energy_kwh[name]:,.0f}", f"{first.region_carbon_kg[name]:,.0f}",
                        f"{first.region_vcpu_hours[name]:,.0f}", *extra)
    console.print(regions)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"config": config_json(cfg),
                                        "slo_ceilings": slo_ceilings, "late_starts": not no_late_starts,
                                        "bounds": {k: r.as_dict() for k, r in results.items()}},
                                       indent=2, default=str))
    failed = [r for r in results.values() if math.isnan(r.carbon_kg)]
    if failed:  # an LP without an optimum bounds nothing: say so and fail the command
        console.print(f"[red]no bound: HiGHS ended with {', '.join(r.status for r in failed)}[/red]")
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
