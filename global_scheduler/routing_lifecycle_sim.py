"""The federation that ``meridian bench lifecycle`` replays for the routing tier, cut into windows.

One **window** is one simulated hour of :class:`~global_scheduler.federation_sim.FederationSim` (the carbon
series' resolution, and the hour in which the simulator routes, accounts and checks SLOs). A **timeline**
is the federation's inputs hour by hour: each region's carbon intensity and price, and the workloads that
arrive. Timeline hour ``t`` is window ``t - LEAD_HOURS``: the first ``LEAD_HOURS`` hours exist only as the
past of window 0.

Counterfactual outcomes (:class:`SegmentRunner`): the windows are grouped into fixed segments of
``SEGMENT_WINDOWS``; a checkpoint's outcome on a window is read from one run of the simulator over that
window's segment, started from an empty federation ``LEAD_HOURS`` before the segment (the lead-in's
arrivals fill the clusters, and it gives the day-ahead forecast its day of history) and routed by the
checkpoint throughout. The state at a segment's start is therefore defined by the checkpoint and the
inputs alone, not by whichever model served before it, so a window's outcome does not depend on the range
asked for and is cached per (checkpoint bytes, segment).

Training timelines (:func:`timeline_from_records`) are rebuilt from learning records alone; the clusters are
the federation's configuration (:func:`federation_layout`), which a live router knows as well.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from global_scheduler.federation_sim import (
    FederationConfig,
    FederationSim,
    TraceWorkload,
    _Pending,
    _RunTally,
)
from global_scheduler.routing.gnn_routing import GnnRouting
from gnn.numpy_router import NumpyGATv2Router
from gnn.policy import GnnRoutingNet
from meridian.lifecycle.records import LearningRecord

LEAD_HOURS = 24  # a day: the seasonal-naive forecast reads the same hour one day earlier
SEGMENT_WINDOWS = 96  # 4 days per counterfactual run: the lead-in costs a fifth of the run's hours
LOOKAHEAD_HOURS = 96  # hours of inputs past a timeline's end (forecast horizon + the teacher's hindsight)
# The arrivals row of a record's ``data["arrivals"]``, one per workload arriving in the window.
ARRIVAL_COLUMNS = ("id", "arrival_fraction_of_hour", "duration_h", "replicas", "milli_cpu", "memory_bytes", "gpu",
                   "origin_region", "latency_slo_ms", "deferrable", "deadline_after_arrival_h", "allowed_regions_bits")
LIFECYCLE_REGIONS = ("eu-north", "eu-central", "eu-west", "us-west")
# The federation's configuration: 8 clusters, 2 per region. Its size (nodes per cluster) is fixed once from
# the whole DLRM trace, so every timeline, scenario and retrainer routes over the same clusters.
LAYOUT = FederationConfig(regions=LIFECYCLE_REGIONS, clusters=8, start="06-01", days=30, trace_offset_days=0.0,
                          seed=7, target_peak_utilisation=0.55, drain_hours=0)


@dataclass
class Timeline:
    """The federation's inputs by hour: ``carbon`` and ``price`` are ``(regions, hours + LOOKAHEAD_HOURS)``,
    ``workloads`` arrive at hours ``0 … hours - 1``."""

    carbon: np.ndarray
    price: np.ndarray
    workloads: list[_Pending]
    hours: int


@lru_cache(maxsize=2)
def federation_layout(traces_dir: Path) -> FederationSim:
    """The federation (clusters, regions, tenants' classes) every run copies; built once per process."""
    return FederationSim(LAYOUT, traces_dir)


def sim_over(layout: FederationSim, timeline: Timeline, start_h: int, hours: int) -> FederationSim:
    """A simulator over ``hours`` hours of ``timeline`` from ``start_h``, from an empty federation."""
    sim = copy.copy(layout)
    sim.cfg = replace(layout.cfg, drain_hours=0)
    sim.hours = hours
    width = hours + LOOKAHEAD_HOURS
    idx = np.minimum(start_h + np.arange(width), timeline.carbon.shape[1] - 1)
    sim.carbon = timeline.carbon[:, idx]
    sim.price = timeline.price[:, idx]
    sim.workloads = [_shifted(p, start_h) for p in timeline.workloads if start_h <= p.arrival_h < start_h + hours]
    return sim


def _shifted(p: _Pending, hours: int) -> _Pending:
    return replace(p, w=replace(p.w, arrival_h=p.w.arrival_h - hours), arrival_h=p.arrival_h - hours,
                   deadline_h=p.deadline_h - hours)


class _HourlySim(FederationSim):
    """Records the run's cumulative carbon, replica-hours and SLO violations after every simulated hour."""

    hourly: list[tuple[float, float, int]]

    def _check_slos(self, hour: int, util: np.ndarray, tally: _RunTally) -> None:
        super()._check_slos(hour, util, tally)
        self.hourly.append((tally.carbon, tally.replica_hours, tally.slo_violations))


class _FrozenNet(GnnRoutingNet):
    """A router whose weights do not change during a run: its numpy forward is exported once, instead of
    checking every parameter's version at each decision (a fifth of a decision's time in a counterfactual)."""

    def _numpy_forward(self) -> NumpyGATv2Router | None:
        if self._fast is None and self.model.graph_self_loops:
            self._fast = NumpyGATv2Router(self.model)
        return self._fast


def load_frozen(checkpoint: Path) -> GnnRoutingNet:
    net = GnnRoutingNet.load(checkpoint)
    net.__class__ = _FrozenNet
    return net


def hourly_outcomes(sim: FederationSim, net: GnnRoutingNet) -> dict[str, np.ndarray]:
    """Each simulated hour's carbon per replica-hour (g) and SLO violations with ``net`` routing."""
    run = copy.copy(sim)
    run.__class__ = _HourlySim  # the copy shares the layout's clusters, built once (seconds) per process
    run.hourly = []
    run.run(GnnRouting(net=net))
    cum = np.array(run.hourly, dtype=np.float64).reshape(-1, 3)
    per_hour = np.diff(cum, axis=0, prepend=0.0)
    carbon_g = per_hour[:, 0] * 1000.0
    # An hour with nothing running emits nothing per replica-hour; max(…, 1) keeps that 0, not NaN.
    return {"carbon_per_replica_hour": carbon_g / np.maximum(per_hour[:, 1], 1.0),
            "slo_violations": per_hour[:, 2]}


class SegmentRunner:
    """Counterfactual outcomes of checkpoints on a timeline's windows (module docstring), cached."""

    def __init__(self, layout: FederationSim, timeline: Timeline, windows: int) -> None:
        self.layout, self.timeline, self.windows = layout, timeline, windows
        self._cache: dict[tuple[bytes, int], dict[str, np.ndarray]] = {}

    def outcomes(self, checkpoint: Path, windows: range) -> dict[str, np.ndarray]:
        if windows.step != 1 or windows.start < 0 or windows.stop > self.windows:
            raise ValueError(f"windows {windows} outside 0 … {self.windows - 1} (or not consecutive)")
        key = hashlib.sha256(checkpoint.read_bytes()).digest()
        net: GnnRoutingNet | None = None
        parts: dict[str, list[np.ndarray]] = {"carbon_per_replica_hour": [], "slo_violations": []}
        if not len(windows):
            return {k: np.zeros(0) for k in parts}
        for seg in range(windows.start // SEGMENT_WINDOWS, (windows.stop - 1) // SEGMENT_WINDOWS + 1):
            if (key, seg) not in self._cache:
                net = net or load_frozen(checkpoint)
                self._cache[(key, seg)] = self._segment(net, seg)
            lo = max(windows.start - seg * SEGMENT_WINDOWS, 0)
            hi = min(windows.stop - seg * SEGMENT_WINDOWS, SEGMENT_WINDOWS)
            for name, values in self._cache[(key, seg)].items():
                parts[name].append(values[lo:hi])
        return {name: np.concatenate(v) for name, v in parts.items()}

    def _segment(self, net: GnnRoutingNet, seg: int) -> dict[str, np.ndarray]:
        first = seg * SEGMENT_WINDOWS
        count = min(SEGMENT_WINDOWS, self.windows - first)
        sim = sim_over(self.layout, self.timeline, first, LEAD_HOURS + count)  # timeline hour = window + lead
        return {name: values[LEAD_HOURS:] for name, values in hourly_outcomes(sim, net).items()}


# ------------------------------------------------------------------------------------------- records
def arrival_rows(workloads: list[_Pending], hour: int) -> tuple[list[list[float]], list[str]]:
    """The ``arrivals`` rows (:data:`ARRIVAL_COLUMNS`) and tenants of the workloads arriving at ``hour``."""
    rows, tenants = [], []
    for p in workloads:
        if p.arrival_h != hour:
            continue
        bits = -1 if p.allowed is None else int(sum(1 << i for i, a in enumerate(p.allowed) if a))
        rows.append([float(p.w.id), p.w.arrival_h - hour, p.w.duration_h, float(p.w.replicas), float(p.w.milli_cpu),
                     float(p.w.memory_bytes), float(p.w.gpu), float(p.origin), p.slo_ms, float(p.deferrable),
                     p.deadline_h - hour, float(bits)])
        tenants.append(p.w.tenant)
    return rows, tenants


def timeline_from_records(records: list[LearningRecord], layout: FederationSim) -> Timeline:
    """The inputs of consecutive records as a timeline (hour 0 = the first record's window); the hours past
    the last record repeat its last day (a seasonal-naive stand-in for the future it has not seen)."""
    records = sorted(records, key=lambda r: r.window)
    n_regions = layout.n_regions
    carbon = np.array([r.data["carbon_g_per_kwh"] for r in records], dtype=np.float64).T.reshape(n_regions, -1)
    price = np.array([r.data["price_per_mwh"] for r in records], dtype=np.float64).T.reshape(n_regions, -1)
    hours = carbon.shape[1]
    period = min(24, hours)
    extra = hours - period + np.arange(LOOKAHEAD_HOURS) % period
    cfg = layout.cfg
    workloads: list[_Pending] = []
    for hour, record in enumerate(records):
        for row, tenant in zip(record.data.get("arrivals", []), record.data.get("tenants", []), strict=True):
            workloads.append(_pending_from_row(list(row), str(tenant), hour, n_regions, cfg))  # type: ignore[arg-type]
    return Timeline(np.concatenate([carbon, carbon[:, extra]], axis=1), np.concatenate([price, price[:, extra]], axis=1),
                    workloads, hours)


def _pending_from_row(row: list[float], tenant: str, hour: int, n_regions: int, cfg: FederationConfig) -> _Pending:
    (wid, frac, duration, replicas, cpu, mem, gpu, origin, slo, deferrable, deadline, bits) = (float(x) for x in row)
    allowed = None if bits < 0 else np.array([(int(bits) >> i) & 1 == 1 for i in range(n_regions)])
    w = TraceWorkload(int(wid), tenant, hour + frac, duration, int(replicas), int(cpu), int(mem), int(gpu))
    batch = deferrable > 0
    return _Pending(w, hour, hour + deadline, batch, int(origin), slo, allowed,
                    cfg.weights_batch if batch else cfg.weights_latency_sensitive)


def minute_samples(hourly: np.ndarray, hour: int) -> list[float]:
    """One window's per-minute samples of an hourly series: linear between this hour's value and the next's
    (the drift detectors are tuned for one sample a minute, a day being 1440 samples)."""
    a, b = float(hourly[hour]), float(hourly[min(hour + 1, len(hourly) - 1)])
    return [a + (b - a) * m / 60.0 for m in range(60)]
