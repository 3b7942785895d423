"""Energy arithmetic: power samples and energy counters into joules, joules into carbon and cost.

Pure, vectorised functions over numpy arrays; no I/O. Units are in the names: seconds (``_s``),
watts, joules, grams, gCO2/kWh (``_g_per_kwh``) and currency per MWh (``_per_mwh``, the unit the
ENTSO-E day-ahead market publishes).

Gap policy
----------
Samples are irregular. Between two consecutive samples no more than ``max_gap_s`` apart the power is
taken to change linearly, so the energy of that interval is the trapezoid ``(p0 + p1) / 2 · dt``. An
interval longer than ``max_gap_s`` is **not interpolated**: its energy is *unknown* (``NaN`` per
interval), it adds nothing to the totals and its duration is reported as ``unknown_s`` so a report can
say how much of the time it could not see. Interpolating across an outage would invent a number
that looks measured; an explicit hole is more honest and is what an operator can act on.

A cumulative counter (RAPL ``energy_uj``, ``NodeTelemetry.energy_joules``) measures the energy of a gap
itself, so a gap is trusted, except for a counter with a finite wrap range: after more than
``max_gap_s`` it may have wrapped several times, so that interval is unknown too.

Counter resets and wrap-around
------------------------------
A decrease of a counter is either a wrap (RAPL counters wrap at ``max_energy_range_uj``) or a reset
(the agent or the machine restarted). With a wrap range the decrease is read as one wrap,
``delta + range``, unless that is more than ``max_power_watts · dt`` could have produced, in which
case it is a reset. A reset contributes the counter's new value (the energy since it restarted from
zero), as Prometheus' ``increase()`` does; the energy between the last sample and the restart is lost
and the reset is counted so the report can say so.

Attribution (Kepler-style)
--------------------------
A node's energy over an interval is split into an *idle* part, the node's baseline power (the power
model's idle coefficient, or a measured floor) times the interval, and an *active* (dynamic) part,
the rest. The active part goes to pods in proportion to their CPU time in the interval, as Kepler
does (``pod = pod CPU time Δ / node CPU time Δ × active``). Kepler (≥ 0.10) leaves idle energy with
the node; the Kepler paper (CLOUD '23) shares constant power out among users following the GHG
Protocol. Meridian's default, ``idle_split="requests"``, does the latter by CPU *requests*: a pod that
reserves a quarter of a node's allocatable CPU carries a quarter of its idle power, because that
reservation is what keeps the node powered; idle energy of unrequested capacity stays unattributed
(reported as ``(idle)``), which is the platform's overhead to shrink. ``"cpu"`` splits idle by CPU
time like the active part; ``"none"`` is Kepler ≥ 0.10's behaviour. Whatever the split, the pods'
shares plus the unattributed remainder equal the node's energy exactly (energy is conserved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

JOULES_PER_KWH = 3.6e6
JOULES_PER_MWH = 3.6e9

IdleSplit = Literal["requests", "cpu", "none"]

FloatArray = NDArray[np.float64]


class EnergyInputError(ValueError):
    """Samples that cannot be integrated (unsorted times, mismatched shapes, negative power)."""


def _samples(t_s: ArrayLike, values: ArrayLike, what: str) -> tuple[FloatArray, FloatArray]:
    t = np.asarray(t_s, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if t.ndim != 1 or t.shape != v.shape:
        raise EnergyInputError(f"times and {what} must be 1-D arrays of one length, got {t.shape} and {v.shape}")
    if len(t) > 1 and (np.diff(t) < 0).any():
        raise EnergyInputError("sample times must be non-decreasing")
    if not np.isfinite(t).all():
        raise EnergyInputError("sample times must be finite")
    return t, v


def trapezoid_intervals_joules(t_s: ArrayLike, power_watts: ArrayLike, *, max_gap_s: float) -> FloatArray:
    """Energy of each interval between consecutive samples; ``NaN`` where the interval is a gap.

    ``len(result) == len(t_s) - 1``. A sample with non-finite power makes its two intervals unknown.
    """
    t, p = _samples(t_s, power_watts, "power")
    if (p[np.isfinite(p)] < 0).any():
        raise EnergyInputError("power must not be negative")
    dt = np.diff(t)
    energy = (p[1:] + p[:-1]) * 0.5 * dt
    return np.where(dt <= max_gap_s, energy, np.nan)


@dataclass(frozen=True)
class EnergyIntegral:
    """Energy over a span of samples, with how much of the span it could not see."""

    energy_joules: float
    covered_s: float
    unknown_s: float
    gaps: int

    @property
    def mean_power_watts(self) -> float:
        """Mean power over the covered time (``NaN`` when nothing was covered)."""
        return self.energy_joules / self.covered_s if self.covered_s > 0 else float("nan")


def integrate_power(t_s: ArrayLike, power_watts: ArrayLike, *, max_gap_s: float) -> EnergyIntegral:
    """Trapezoid integral of power over irregular samples, gaps left out and counted (module doc)."""
    t, _ = _samples(t_s, power_watts, "power")
    per_interval = trapezoid_intervals_joules(t_s, power_watts, max_gap_s=max_gap_s)
    dt = np.diff(t)
    known = np.isfinite(per_interval)
    return EnergyIntegral(
        energy_joules=float(per_interval[known].sum()),
        covered_s=float(dt[known].sum()),
        unknown_s=float(dt[~known].sum()),
        gaps=int((~known).sum()),
    )


def energy_per_bucket_joules(
    t_s: ArrayLike, power_watts: ArrayLike, *, bucket_s: float, max_gap_s: float, origin_s: float = 0.0,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Energy and unknown seconds per time bucket ``[origin + k·bucket_s, origin + (k+1)·bucket_s)``.

    Exact for piecewise-linear power: bucket boundaries inside an interval get a sample interpolated
    on the line between its ends, so the trapezoids split at the boundary rather than by time share.
    Returns ``(bucket_start_s, energy_joules, unknown_s)`` for the buckets the samples span.
    """
    t, p = _samples(t_s, power_watts, "power")
    if len(t) < 2:
        return np.empty(0), np.empty(0), np.empty(0)
    first = np.floor((t[0] - origin_s) / bucket_s)
    last = np.ceil((t[-1] - origin_s) / bucket_s)
    edges = origin_s + np.arange(first, last + 1) * bucket_s
    inner = edges[(edges > t[0]) & (edges < t[-1])]
    # Interpolate on each original interval; the gap flag of a split piece is its parent's.
    parent = np.searchsorted(t, inner, side="right") - 1
    parent_gap = np.diff(t)[parent] > max_gap_s
    tt = np.concatenate([t, inner])
    pp = np.concatenate([p, np.interp(inner, t, p)])
    gap_at = np.concatenate([np.r_[np.diff(t) > max_gap_s, False], parent_gap])
    order = np.argsort(tt, kind="stable")
    tt, pp, gap_at = tt[order], pp[order], gap_at[order]
    dt = np.diff(tt)
    piece_energy = (pp[1:] + pp[:-1]) * 0.5 * dt
    piece_gap = gap_at[:-1]
    bucket = np.floor((tt[:-1] - edges[0]) / bucket_s).astype(np.int64)
    n = len(edges) - 1
    energy = np.bincount(bucket, np.where(piece_gap, 0.0, piece_energy), minlength=n)[:n]
    unknown = np.bincount(bucket, np.where(piece_gap, dt, 0.0), minlength=n)[:n]
    return edges[:-1], energy, unknown


@dataclass(frozen=True)
class CounterIncrements:
    """Per-interval energy from a cumulative counter; ``NaN`` where unknown."""

    increments_joules: FloatArray
    wraps: int
    resets: int

    @property
    def energy_joules(self) -> float:
        return float(np.nansum(self.increments_joules))


def counter_increments_joules(
    counter_joules: ArrayLike,
    *,
    t_s: ArrayLike | None = None,
    wrap_range_joules: float | None = None,
    max_power_watts: float | None = None,
    max_gap_s: float | None = None,
) -> CounterIncrements:
    """Energy per interval from a cumulative counter, with wrap and reset handling (module doc).

    ``t_s`` is needed for the wrap-plausibility test (``max_power_watts``) and the gap rule
    (``max_gap_s``); without it every decrease is a wrap (given a range) or a reset.
    """
    c = np.asarray(counter_joules, dtype=np.float64)
    if c.ndim != 1:
        raise EnergyInputError("counter must be a 1-D array")
    if (c < 0).any():
        raise EnergyInputError("an energy counter is never negative")
    delta = np.diff(c)
    dt = None
    if t_s is not None:
        t, _ = _samples(t_s, c, "counter")
        dt = np.diff(t)
    decreased = delta < 0
    wrapped = np.zeros_like(decreased)
    if wrap_range_joules is not None:
        wrapped = decreased.copy()
        if max_power_watts is not None and dt is not None:
            wrapped &= (delta + wrap_range_joules) <= max_power_watts * dt
    reset = decreased & ~wrapped
    increments = np.where(wrapped, delta + (wrap_range_joules or 0.0), delta)
    # After a reset the counter restarted from zero: its new value is what it has seen since.
    increments = np.where(reset, c[1:], increments)
    if wrap_range_joules is not None and max_gap_s is not None and dt is not None:
        # A wrapping counter read too rarely may have wrapped more than once: unknown.
        increments = np.where(dt > max_gap_s, np.nan, increments)
    return CounterIncrements(increments, wraps=int(wrapped.sum()), resets=int(reset.sum()))


@dataclass(frozen=True)
class Attribution:
    """Pods' shares of node energy; ``unattributed_joules`` per node closes the balance."""

    pod_active_joules: FloatArray
    pod_idle_joules: FloatArray
    unattributed_joules: FloatArray

    @property
    def pod_joules(self) -> FloatArray:
        return self.pod_active_joules + self.pod_idle_joules


def attribute_node_energy(
    *,
    node_energy_joules: ArrayLike,
    node_idle_joules: ArrayLike,
    node_allocatable_cpu_cores: ArrayLike,
    pod_node_index: ArrayLike,
    pod_cpu_core_seconds: ArrayLike,
    pod_requested_cpu_cores: ArrayLike,
    idle_split: IdleSplit = "requests",
) -> Attribution:
    """Kepler-style split of each node's energy among its pods (module doc, "Attribution").

    Node arrays have one entry per node; pod arrays one per pod, ``pod_node_index`` naming its node.
    ``node_idle_joules`` is the idle power times the interval; it is capped at the node's energy (a
    node measured below its modelled idle floor spent it all idling).
    """
    energy = np.asarray(node_energy_joules, dtype=np.float64)
    idle = np.minimum(np.asarray(node_idle_joules, dtype=np.float64), energy)
    active = energy - idle
    alloc = np.asarray(node_allocatable_cpu_cores, dtype=np.float64)
    node_of = np.asarray(pod_node_index, dtype=np.int64)
    cpu = np.asarray(pod_cpu_core_seconds, dtype=np.float64)
    req = np.asarray(pod_requested_cpu_cores, dtype=np.float64)
    n = len(energy)
    if (cpu < 0).any() or (req < 0).any():
        raise EnergyInputError("pod CPU time and requests must not be negative")
    if len(node_of) and (node_of.min() < 0 or node_of.max() >= n):
        raise EnergyInputError("pod_node_index names a node that is not in the node arrays")

    node_cpu = np.bincount(node_of, cpu, minlength=n)
    cpu_share = np.divide(cpu, node_cpu[node_of], out=np.zeros_like(cpu), where=node_cpu[node_of] > 0)
    pod_active = active[node_of] * cpu_share
    if idle_split == "requests":
        # Overcommitted requests share the node's idle power pro rata instead of exceeding it.
        node_req = np.bincount(node_of, req, minlength=n)
        denom = np.maximum(alloc, node_req)[node_of]
        req_share = np.divide(req, denom, out=np.zeros_like(req), where=denom > 0)
        pod_idle = idle[node_of] * req_share
    elif idle_split == "cpu":
        pod_idle = idle[node_of] * cpu_share
    elif idle_split == "none":
        pod_idle = np.zeros_like(cpu)
    else:
        raise EnergyInputError(f"idle_split must be 'requests', 'cpu' or 'none', got {idle_split!r}")
    given = np.bincount(node_of, pod_active + pod_idle, minlength=n)
    return Attribution(pod_active, pod_idle, energy - given)


def facility_energy_joules(it_energy_joules: ArrayLike, pue: ArrayLike) -> FloatArray:
    """IT energy scaled by the site's power usage effectiveness (cooling, power conversion)."""
    return np.asarray(it_energy_joules, dtype=np.float64) * np.asarray(pue, dtype=np.float64)


def carbon_grams(it_energy_joules: ArrayLike, pue: ArrayLike, intensity_g_per_kwh: ArrayLike) -> FloatArray:
    """Carbon = IT energy × PUE × the grid intensity of the same interval (element-wise)."""
    return facility_energy_joules(it_energy_joules, pue) / JOULES_PER_KWH * np.asarray(
        intensity_g_per_kwh, dtype=np.float64)


def energy_cost(it_energy_joules: ArrayLike, pue: ArrayLike, price_per_mwh: ArrayLike) -> FloatArray:
    """Cost = IT energy × PUE × the price of the same interval (element-wise).

    The site buys facility energy, not IT energy, so PUE applies to cost as it does to carbon. Day-ahead
    prices can be negative; so can a cost.
    """
    return facility_energy_joules(it_energy_joules, pue) / JOULES_PER_MWH * np.asarray(
        price_per_mwh, dtype=np.float64)


def hourly_values_at(
    t_s: ArrayLike, series_start_s: float, hourly_values: ArrayLike, *, step_s: float = 3600.0,
) -> FloatArray:
    """The value of a regular series (hourly by default) in force at each time ``t_s``.

    An interval's carbon and cost use the intensity and price of the hour it falls in; callers with
    intervals that cross an hour boundary split them first (``energy_per_bucket_joules`` with
    ``bucket_s=3600``). Raises ``IndexError`` outside the series rather than extrapolating.
    """
    values = np.asarray(hourly_values, dtype=np.float64)
    idx = np.floor((np.asarray(t_s, dtype=np.float64) - series_start_s) / step_s).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= len(values)):
        raise IndexError("times fall outside the series")
    return values[idx]
