"""A simulator of one service driven by a request-rate series, stepped every ``tick_s`` (15 s).

Per tick:

1. **Actuate** the policy's desired replica count: extra pods are created *pending* and become ready
   ``startup_delay_s`` later; removals take pending pods first (newest first), then ready ones.
2. **Serve**: demand is expressed in replicas at 100% (``load``; the minute's rate spread evenly over its
   ticks). Ready replicas serve up to their capacity; the excess joins a fluid backlog; backlog older than
   ``timeout_s`` is dropped (errors). Utilisation = served / capacity.
3. **Latency**: p99 of an M/M/c replica at the offered utilisation (:mod:`queueing`) plus the backlog's
   drain time.

Controllers never see the present: the observation at tick ``k`` carries metrics up to
``k − metrics_delay`` (utilisation averaged over ``metrics_window_s``), like metrics-server.

A minute violates the SLO when any of its ticks has a p99 above ``slo_p99_ms`` or its dropped fraction
exceeds ``max_error_rate``. Minutes whose rate is missing in the series (NaN) are simulated with the last
known rate but are left out of SLO and latency statistics: nobody knows what happened then.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from regional_scheduler.autoscaling.queueing import SATURATED, p99_latency_s
from regional_scheduler.autoscaling.settings import ServiceSettings

_LATENCY_TABLE_POINTS = 4000


@dataclass(slots=True)
class Observation:
    """What a controller may know at one tick (all metrics delayed by ``metrics_delay_s``)."""

    tick: int
    time_s: float
    minute: int
    current_replicas: int
    ready_replicas: int
    pending_replicas: int
    utilisation: float | None
    load_replicas: float
    p99_latency_ms: float
    error_rate: float
    slo_breached: bool
    observed_minutes: int


@dataclass(frozen=True)
class RunResult:
    """Per-tick and per-minute records of one run, with the benchmark's summary statistics."""

    replicas: np.ndarray
    ready: np.ndarray
    utilisation: np.ndarray
    p99_ms: np.ndarray
    scale_events: int
    minute_violated: np.ndarray
    minute_observed: np.ndarray
    tick_weight: np.ndarray
    tick_s: float

    def summary(self, first_minute: int = 0) -> dict[str, float]:
        tpm = round(60 / self.tick_s)
        first_tick = first_minute * tpm
        observed = self.minute_observed[first_minute:]
        weights = self.tick_weight[first_tick:] * np.repeat(observed, tpm)[: self.tick_weight.size - first_tick]
        latencies = self.p99_ms[first_tick:]
        return {
            "slo_violation_minutes": int(np.sum(self.minute_violated[first_minute:] & observed)),
            "p99_latency_ms": float(weighted_quantile(latencies, weights, 0.99)),
            "replica_hours": float(np.sum(self.replicas[first_tick:]) * self.tick_s / 3600.0),
            "scale_events": int(self.scale_events),
            "observed_minutes": int(np.sum(observed)),
        }


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile of ``values`` weighted by ``weights`` (0 if no weight)."""
    total = float(np.sum(weights))
    if total <= 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][min(int(np.searchsorted(cumulative, q * total)), values.size - 1)])


class ServiceSimulator:
    """One service replaying ``load_per_minute`` (demand in replicas at 100%; NaN = missing)."""

    def __init__(self, load_per_minute: np.ndarray, service: ServiceSettings, *, initial_replicas: int,
                 start_minute: int = 0, end_minute: int | None = None) -> None:
        self.service = service
        self.ticks_per_minute = round(60 / service.tick_s)
        if abs(self.ticks_per_minute * service.tick_s - 60) > 1e-9:
            raise ValueError(f"tick_s={service.tick_s} must divide a minute")
        load = np.asarray(load_per_minute, dtype=float)
        self.minute_observed_all = np.isfinite(load)
        filled = load.copy()
        # Hold the last known rate through missing minutes (leading gaps take the first known rate).
        idx = np.where(self.minute_observed_all, np.arange(load.size), 0)
        np.maximum.accumulate(idx, out=idx)
        filled = filled[idx]
        first_known = filled[self.minute_observed_all][0] if self.minute_observed_all.any() else 0.0
        filled[~np.isfinite(filled)] = first_known
        self.load_per_minute = filled
        self.start_minute = start_minute
        self.end_minute = load.size if end_minute is None else end_minute
        self.initial_replicas = initial_replicas
        grid = np.linspace(0.0, SATURATED, _LATENCY_TABLE_POINTS)
        self._latency_table = (p99_latency_s(grid, workers=service.workers_per_replica,
                                             service_time_s=service.service_time_ms / 1000.0) * 1000.0).tolist()
        self._slo_ms = service.slo_p99_ms

    def _latency_ms(self, utilisation: float) -> float:
        if utilisation >= SATURATED:
            return self._latency_table[-1]
        return self._latency_table[int(utilisation / SATURATED * (_LATENCY_TABLE_POINTS - 1))]

    def reset(self) -> None:
        """Start (again) at ``start_minute`` with ``initial_replicas`` ready and no backlog."""
        svc = self.service
        tpm = self.ticks_per_minute
        self.n_ticks = (self.end_minute - self.start_minute) * tpm
        self._delay_ticks = round(svc.metrics_delay_s / svc.tick_s)
        self._window_ticks = max(1, round(svc.metrics_window_s / svc.tick_s))
        self._startup_ticks = math.ceil(svc.startup_delay_s / svc.tick_s - 1e-9)
        self._timeout_ticks = svc.timeout_s / svc.tick_s
        self._max_latency_ms = (svc.timeout_s + svc.service_time_ms / 1000.0) * 1000.0
        self._load = self.load_per_minute[self.start_minute:self.end_minute].tolist()
        self._replicas_rec = [0] * self.n_ticks
        self._ready_rec = [0] * self.n_ticks
        self._util_rec = [0.0] * self.n_ticks
        self._p99_rec = [0.0] * self.n_ticks
        self._error_rec = [0.0] * self.n_ticks
        self._weight_rec = [0.0] * self.n_ticks
        self.ready = self.initial_replicas
        self.pending: list[int] = []  # tick at which each pending pod becomes ready (ascending)
        self.backlog = 0.0
        self.scale_events = 0
        self.tick = 0

    @classmethod
    def open_ended(cls, service: ServiceSettings, *, initial_replicas: int) -> ServiceSimulator:
        """A simulator with no minutes yet, extended as load becomes known (:meth:`append_minutes`): a
        model of the service run beside a live one (the budget's shadow HPA), never ahead of what was
        observed."""
        simulator = cls(np.empty(0), service, initial_replicas=initial_replicas)
        simulator.reset()
        return simulator

    def append_minutes(self, load: np.ndarray | list[float]) -> None:
        """Extend the replay by minutes of known load (replicas at 100%), e.g. one per observed minute."""
        values = np.asarray(load, dtype=float).ravel()
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ValueError(f"appended load must be finite and non-negative, got {values.tolist()}")
        extra = values.size * self.ticks_per_minute
        self.load_per_minute = np.concatenate([self.load_per_minute, values])
        self.minute_observed_all = np.concatenate([self.minute_observed_all, np.ones(values.size, dtype=bool)])
        self.end_minute += values.size
        self._load.extend(values.tolist())
        self.n_ticks += extra
        for ints in (self._replicas_rec, self._ready_rec):
            ints.extend([0] * extra)
        for floats in (self._util_rec, self._p99_rec, self._error_rec, self._weight_rec):
            floats.extend([0.0] * extra)

    @property
    def replicas(self) -> int:
        """Replicas asked for right now (ready + pending)."""
        return self.ready + len(self.pending)

    @property
    def done(self) -> bool:
        return self.tick >= self.n_ticks

    def observe(self) -> Observation:
        """What a controller sees at the current tick (metrics delayed by ``metrics_delay_s``)."""
        k = self.tick
        tpm = self.ticks_per_minute
        seen = k - self._delay_ticks
        if seen >= 0:
            lo = max(0, seen - self._window_ticks + 1)
            window = self._util_rec[lo:seen + 1]
            utilisation: float | None = sum(window) / len(window) if self._ready_rec[seen] > 0 else None
            load_seen = self._load[seen // tpm]
            p99_seen = self._p99_rec[seen]
            err_seen = self._error_rec[seen]
        else:
            utilisation, load_seen, p99_seen, err_seen = None, self._load[0], 0.0, 0.0
        return Observation(
            tick=k, time_s=k * self.service.tick_s, minute=self.start_minute + k // tpm,
            current_replicas=self.ready + len(self.pending), ready_replicas=self.ready,
            pending_replicas=len(self.pending), utilisation=utilisation, load_replicas=load_seen,
            p99_latency_ms=p99_seen, error_rate=err_seen,
            slo_breached=p99_seen > self._slo_ms or err_seen > self.service.max_error_rate,
            observed_minutes=self.start_minute + max(0, seen + 1) // tpm)

    def step(self, desired_replicas: int) -> None:
        """Actuate ``desired_replicas`` and serve one tick."""
        k = self.tick
        desired = max(0, int(desired_replicas))
        current = self.ready + len(self.pending)
        if desired != current:
            self.scale_events += 1
            if desired > current:
                self.pending.extend([k + self._startup_ticks] * (desired - current))
            else:
                remove = current - desired
                drop_pending = min(remove, len(self.pending))
                if drop_pending:
                    del self.pending[len(self.pending) - drop_pending:]
                self.ready -= remove - drop_pending
        while self.pending and self.pending[0] <= k:
            self.pending.pop(0)
            self.ready += 1
        ready = self.ready
        demand = self._load[k // self.ticks_per_minute]  # a rate: replicas busy at 100%
        work = self.backlog + demand
        served = min(work, float(ready))
        backlog = work - served
        max_backlog = ready * self._timeout_ticks
        dropped = 0.0
        if backlog > max_backlog:
            dropped = backlog - max_backlog
            backlog = max_backlog
        self.backlog = backlog
        if ready > 0:
            util = served / ready
            latency = self._latency_ms(min(demand / ready, SATURATED)) + backlog / ready * self.service.tick_s * 1000
        else:
            util = 0.0
            latency = self._max_latency_ms if demand > 0 else 0.0
        self._replicas_rec[k] = ready + len(self.pending)
        self._ready_rec[k] = ready
        self._util_rec[k] = util
        self._p99_rec[k] = min(latency, self._max_latency_ms)
        self._error_rec[k] = dropped / demand if demand > 0 else 0.0
        self._weight_rec[k] = demand
        self.tick = k + 1

    def minute_violated(self, minute_index: int) -> bool:
        """Whether local minute ``minute_index`` (already simulated) violated the SLO."""
        tpm = self.ticks_per_minute
        lo, hi = minute_index * tpm, (minute_index + 1) * tpm
        if max(self._p99_rec[lo:hi]) > self._slo_ms:
            return True
        weight = sum(self._weight_rec[lo:hi])
        if weight <= 0:
            return False
        errors = sum(e * w for e, w in zip(self._error_rec[lo:hi], self._weight_rec[lo:hi], strict=True))
        return errors / weight > self.service.max_error_rate

    def result(self) -> RunResult:
        tpm = self.ticks_per_minute
        n_minutes = self.n_ticks // tpm
        p99 = np.asarray(self._p99_rec)
        errors = np.asarray(self._error_rec).reshape(n_minutes, tpm)
        weights = np.asarray(self._weight_rec).reshape(n_minutes, tpm)
        total = weights.sum(1)
        minute_error = np.where(total > 0, (errors * weights).sum(1) / np.maximum(total, 1e-12), 0.0)
        violated = (p99.reshape(n_minutes, tpm).max(1) > self._slo_ms) | (minute_error > self.service.max_error_rate)
        return RunResult(
            replicas=np.asarray(self._replicas_rec), ready=np.asarray(self._ready_rec),
            utilisation=np.asarray(self._util_rec), p99_ms=p99, scale_events=self.scale_events,
            minute_violated=violated,
            minute_observed=self.minute_observed_all[self.start_minute:self.end_minute].copy(),
            tick_weight=np.asarray(self._weight_rec), tick_s=self.service.tick_s)

    def run(self, decide: Callable[[Observation], int]) -> RunResult:
        """Replay minutes ``[start_minute, end_minute)`` with ``decide`` called once per tick."""
        self.reset()
        while self.tick < self.n_ticks:
            self.step(decide(self.observe()))
        return self.result()
