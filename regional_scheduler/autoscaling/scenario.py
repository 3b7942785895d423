"""A scenario: one series, sized from its training days, with its forecast and train/held-back split."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regional_scheduler.autoscaling.forecaster import SeasonalForecaster
from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy, PolicyContext
from regional_scheduler.autoscaling.request_series import (
    DaySplit,
    RequestSeries,
    load_request_series,
    split_days,
)
from regional_scheduler.autoscaling.service_sizing import size_service
from regional_scheduler.autoscaling.settings import AutoscalerSettings
from regional_scheduler.autoscaling.simulator import RunResult, ServiceSimulator

WARM_UP_MINUTES = 60


@dataclass(frozen=True)
class Scenario:
    series: RequestSeries
    split: DaySplit
    load: np.ndarray  # demand in replicas at 100% per minute (NaN = missing)
    context: PolicyContext
    settings: AutoscalerSettings

    @property
    def name(self) -> str:
        return self.series.name

    def run(self, policy: AutoscalingPolicy, start_minute: int, end_minute: int) -> tuple[RunResult, int]:
        """Run ``policy`` over ``[start, end)`` after a warm-up hour; returns the result and the first
        minute (in the result's own indexing) that counts."""
        warm_start = max(0, start_minute - WARM_UP_MINUTES)
        first = self.load[warm_start]
        initial = math.ceil((first if np.isfinite(first) else 1.0) / self.context.sizing.target_utilisation)
        initial = min(max(initial, self.context.sizing.min_replicas, 1), self.context.sizing.max_replicas)
        simulator = ServiceSimulator(self.load, self.settings.service, initial_replicas=initial,
                                     start_minute=warm_start, end_minute=end_minute)
        policy.reset(self.context)
        return simulator.run(policy.decide), start_minute - warm_start

    def held_back(self, policy: AutoscalingPolicy) -> dict[str, float]:
        result, first = self.run(policy, self.split.train_end_minute, self.split.total_minutes)
        return result.summary(first)

    def training(self, policy: AutoscalingPolicy, last_days: int | None = None,
                 end_minute: int | None = None) -> dict[str, float]:
        """``policy`` over the training days (the ``last_days`` before ``end_minute``, default their end)."""
        end = self.split.train_end_minute if end_minute is None else min(end_minute, self.split.train_end_minute)
        start = 0 if last_days is None else max(0, end - last_days * 1440)
        result, first = self.run(policy, start, end)
        return result.summary(first)


def build_scenario(path: Path, settings: AutoscalerSettings | None = None) -> Scenario:
    return scenario_from_series(load_request_series(path), settings)


def scenario_from_series(series: RequestSeries, settings: AutoscalerSettings | None = None) -> Scenario:
    """A scenario of a series already in memory (a file's, or one region's share of it)."""
    settings = settings or AutoscalerSettings()
    split = split_days(series, settings.split.held_back_fraction)
    sizing = size_service(series.requests_per_minute[: split.train_end_minute], settings.sizing, settings.service)
    load = sizing.load_in_replicas(series.requests_per_minute)
    context = PolicyContext(sizing=sizing, service=settings.service,
                            forecast=SeasonalForecaster().fit_transform(load),
                            start_minute_of_day=series.start.hour * 60 + series.start.minute,
                            start_weekday=series.start.weekday())
    return Scenario(series=series, split=split, load=load, context=context, settings=settings)
