"""What every autoscaling policy implements, and what it is given about the service."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from regional_scheduler.autoscaling.forecaster import SeasonalForecast
from regional_scheduler.autoscaling.guard_rails import GuardRails
from regional_scheduler.autoscaling.service_sizing import ServiceSizing
from regional_scheduler.autoscaling.settings import GuardRailSettings, ServiceSettings
from regional_scheduler.autoscaling.simulator import Observation


@dataclass(frozen=True)
class PolicyContext:
    """The service a policy scales: its sizing, timing and a causal forecast of its load (in replicas)."""

    sizing: ServiceSizing
    service: ServiceSettings
    forecast: SeasonalForecast
    start_minute_of_day: int = 0
    start_weekday: int = 0

    @property
    def lead_minutes(self) -> int:
        """Minutes ahead a decision taken now must cover: metrics delay + one tick + pod start-up."""
        svc = self.service
        return math.ceil((svc.startup_delay_s + svc.metrics_delay_s + svc.tick_s) / 60.0)

    def guard_rail_settings(self) -> GuardRailSettings:
        """Rails for this service: its bounds, and on a breach a scale-up to the SLO's utilisation."""
        from regional_scheduler.autoscaling.queueing import max_utilisation_within_slo

        svc = self.service
        u_slo = max_utilisation_within_slo(workers=svc.workers_per_replica, service_time_s=svc.service_time_ms / 1000,
                                           slo_s=svc.slo_p99_ms / 1000)
        return GuardRailSettings(min_replicas=self.sizing.min_replicas, max_replicas=self.sizing.max_replicas,
                                 breach_target_utilisation=0.95 * u_slo)


class AutoscalingPolicy(Protocol):
    """A policy proposes a replica count each tick; guarded policies pass it through :class:`GuardRails`."""

    name: str

    def reset(self, context: PolicyContext) -> None: ...

    def decide(self, observation: Observation) -> int: ...


@runtime_checkable
class FollowsContext(Protocol):
    """A policy that can take a fresh :class:`PolicyContext` while serving (one more minute of history, a
    new forecast and sizing) and keep its memory: the HPA's recommendations and scale events, the guard
    rails' cool-down, a fitted model.

    Declared, not defaulted: a policy without it cannot follow a context in place, so the online
    autoscaler resets it with each new context instead. A no-op default would leave such a policy on the
    first minute's forecast and sizing for good."""

    def update_context(self, context: PolicyContext) -> None: ...


@runtime_checkable
class ScalesOnUtilisation(Protocol):
    """A policy that decides on the observed CPU utilisation (``Observation.utilisation``: usage / request
    over the ready pods) and does nothing without it, as the HPA does without metrics.

    Declared so the serving loop can refuse to start such a policy on a metrics source that supplies no
    utilisation, instead of running a policy that silently never scales."""

    def utilisation_metric(self) -> str:
        """What the policy needs, in words, for the refusal's message."""
        ...


RECENT_PEAK_MINUTES = 10
SPREAD_FLOOR_FRACTION = 0.05


def _recent_peak(context: PolicyContext, observation: Observation, minutes: int) -> float:
    last = observation.observed_minutes - 1
    history = context.forecast.last_observed[max(0, last - minutes + 1):last + 1]
    return max(observation.load_replicas, float(history.max()) if history.size else 0.0)


def forecast_needed_load(context: PolicyContext, observation: Observation, *, extra_minutes: int = 2,
                         recent_minutes: int = RECENT_PEAK_MINUTES) -> float:
    """Load (replicas at 100%) to provision for: the highest of the forecast peak from now until new pods
    would be ready (plus ``extra_minutes``) and the load observed over the last ``recent_minutes``.

    The recent peak is what makes bursty load safe to follow (bursts cluster: a burst a few minutes ago
    predicts one now better than the seasonal profile does, which is also why the HPA keeps the highest
    recommendation of the last 5 minutes); the forecast adds what is coming before pods could be ready.
    """
    last = observation.observed_minutes - 1
    recent = _recent_peak(context, observation, recent_minutes)
    if last < 0:
        return recent
    first_h = max(1, observation.minute - last)
    peak = context.forecast.peak(last, first_h, first_h + context.lead_minutes + extra_minutes)
    return max(recent, peak) if math.isfinite(peak) else recent


def forecast_upper_load(context: PolicyContext, observation: Observation, *, extra_minutes: int = 2,
                        recent_minutes: int = RECENT_PEAK_MINUTES) -> float:
    """As :func:`forecast_needed_load` with the upper seasonal forecast (recurring bursts)."""
    last = observation.observed_minutes - 1
    recent = _recent_peak(context, observation, recent_minutes)
    if last < 0:
        return recent
    first_h = max(1, observation.minute - last)
    peak = context.forecast.upper_peak(last, first_h, first_h + context.lead_minutes + extra_minutes)
    return max(recent, peak) if math.isfinite(peak) else recent


def forecast_spread(context: PolicyContext, observation: Observation) -> float:
    """Noise no forecast can foresee (load in replicas): the recent robust one-minute forecast error,
    at least ``SPREAD_FLOOR_FRACTION`` of the load to provision for (a day-to-day profile error that a
    step-wise series, e.g. hourly data, never shows minute to minute)."""
    last = observation.observed_minutes - 1
    spread = float(context.forecast.spread[last]) if last >= 0 else 0.0
    return max(spread, SPREAD_FLOOR_FRACTION * forecast_needed_load(context, observation))


class GuardedPolicy(FollowsContext):
    """Wraps a proposing policy with the guard rails (the learned and forecast policies use this)."""

    def __init__(self) -> None:
        self.rails: GuardRails | None = None
        self.last_rails: tuple[str, ...] = ()

    def reset_rails(self, context: PolicyContext) -> None:
        self.rails = GuardRails(context.guard_rail_settings())

    def update_context(self, context: PolicyContext) -> None:
        """Serving: a fresh forecast/sizing each minute, keeping the rails' memory (cool-down)."""
        self.context = context  # type: ignore[attr-defined]
        if self.rails is not None:
            self.rails.settings = context.guard_rail_settings()

    def guard(self, proposed: int, observation: Observation) -> int:
        assert self.rails is not None, "reset() first"
        decision = self.rails.apply(proposed=proposed, current=observation.current_replicas,
                                    now_s=observation.time_s, slo_breached=observation.slo_breached,
                                    utilisation=observation.utilisation, ready=observation.ready_replicas)
        self.last_rails = decision.rails
        return decision.replicas
