"""The serving-side autoscaler: per-minute samples in, a guarded replica count out.

It keeps up to ``history_days`` of per-minute request rates, refits the (cheap, causal) forecaster on
them each minute, and asks the configured policy for a decision on an :class:`Observation` built from
the latest sample — the same code path the benchmark exercises. Until a day of history exists the
forecaster degrades to persistence. Capacity per replica is either given (``capacity_per_replica_rpm``,
measured by a load test) or, failing that, derived from the history as the benchmark does.

Utilisation is what the metrics source measured (CPU usage / request over the ready pods, as the HPA
reads it). A source that has only request rates (a replayed series: a demo) may ask for it to be
*modelled* instead (``model_utilisation``): the minute's load in replicas at 100 % over the ready
replicas, capped at 1, as the simulator defines it. Otherwise a sample without utilisation stays
without it, and a policy that needs it is refused by the serving loop before it starts
(:mod:`..serving`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from regional_scheduler.autoscaling.forecaster import SeasonalForecaster
from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy, FollowsContext, PolicyContext
from regional_scheduler.autoscaling.service_sizing import ServiceSizing, size_service
from regional_scheduler.autoscaling.settings import AutoscalerSettings
from regional_scheduler.autoscaling.simulator import Observation


@dataclass(frozen=True)
class ServiceSample:
    """One minute of the service as its metrics pipeline reports it."""

    requests_per_minute: float
    ready_replicas: int
    pending_replicas: int
    utilisation: float | None
    p99_latency_ms: float
    error_rate: float
    current_replicas: int | None = None
    """``spec.replicas`` of the target when known (the scale subresource); else ready + pending."""


class OnlineAutoscaler:
    def __init__(self, policy: AutoscalingPolicy, settings: AutoscalerSettings | None = None, *,
                 capacity_per_replica_rpm: float | None = None, start: datetime | None = None,
                 history_days: float = 8, model_utilisation: bool = False) -> None:
        self.policy = policy
        self.settings = settings or AutoscalerSettings()
        self.capacity_per_replica_rpm = capacity_per_replica_rpm
        self.start = start or datetime.now(tz=UTC)
        if history_days <= 0:
            raise ValueError(f"history_days must be positive, got {history_days}")
        self.history_minutes = max(1, round(history_days * 1440))
        self.rates: list[float] = []
        self.first_minute = 0
        self.desired: int | None = None
        self.model_utilisation = model_utilisation
        self._lock = threading.Lock()

    def _sizing(self) -> ServiceSizing:
        observed = np.asarray(self.rates, dtype=float)
        sizing = size_service(observed, self.settings.sizing, self.settings.service)
        if self.capacity_per_replica_rpm is not None:
            sizing = ServiceSizing(self.capacity_per_replica_rpm, self.settings.service.workers_per_replica * 60.0
                                   / self.capacity_per_replica_rpm, sizing.target_utilisation,
                                   sizing.reference_replicas, sizing.min_replicas, sizing.max_replicas)
        return sizing

    def update(self, sample: ServiceSample) -> int:
        """Record one minute and return the guarded desired replica count."""
        with self._lock:
            self.rates.append(sample.requests_per_minute)
            if len(self.rates) > self.history_minutes:
                drop = len(self.rates) - self.history_minutes
                del self.rates[:drop]
                self.first_minute += drop
            sizing = self._sizing()
            load = sizing.load_in_replicas(np.asarray(self.rates, dtype=float))
            minute_of_start = self.start.hour * 60 + self.start.minute + self.first_minute
            context = PolicyContext(sizing=sizing, service=self.settings.service,
                                    forecast=SeasonalForecaster().fit_transform(load),
                                    start_minute_of_day=minute_of_start % 1440,
                                    start_weekday=(self.start.weekday() + minute_of_start // 1440) % 7)
            if self.desired is not None and isinstance(self.policy, FollowsContext):
                self.policy.update_context(context)  # keeps its memory (HPA recommendations, cool-down)
            else:
                self.policy.reset(context)  # the first minute, or a policy that cannot follow in place
            minute = len(self.rates) - 1
            current = sample.ready_replicas + sample.pending_replicas if sample.current_replicas is None \
                else sample.current_replicas
            last_load = float(load[-1]) if math.isfinite(load[-1]) else 0.0
            utilisation = sample.utilisation
            if utilisation is None and self.model_utilisation and sample.ready_replicas > 0:
                utilisation = min(1.0, last_load / sample.ready_replicas)
            svc = self.settings.service
            obs = Observation(
                tick=minute, time_s=(self.first_minute + minute) * 60.0, minute=minute,
                current_replicas=current, ready_replicas=sample.ready_replicas,
                pending_replicas=sample.pending_replicas, utilisation=utilisation, load_replicas=last_load,
                p99_latency_ms=sample.p99_latency_ms, error_rate=sample.error_rate,
                slo_breached=sample.p99_latency_ms > svc.slo_p99_ms or sample.error_rate > svc.max_error_rate,
                observed_minutes=minute + 1)
            self.desired = int(self.policy.decide(obs))
            return self.desired

    def current_desired(self) -> int | None:
        with self._lock:
            return self.desired
