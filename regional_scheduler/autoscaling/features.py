"""The learned policy's state vector: series-independent, so one checkpoint serves any service.

Every load quantity is divided by the current replica count (so ``1.0`` means "the replicas we have
would run at 100%"), the replica count itself is log-scaled, times are sin/cos encoded. The layout is
stored in the checkpoint and a checkpoint with another layout is refused.
"""

from __future__ import annotations

import math

import numpy as np

from regional_scheduler.autoscaling.policies.base import (
    PolicyContext,
    forecast_needed_load,
    forecast_spread,
    forecast_upper_load,
)
from regional_scheduler.autoscaling.simulator import Observation

HISTORY_LAGS_MIN = (1, 2, 5, 10, 15, 30)
FORECAST_HORIZONS_MIN = (1, 2, 3, 5, 10, 15)
FEATURE_LAYOUT: tuple[str, ...] = (
    "log_replicas", "pending_fraction", "utilisation", "load_per_replica", "p99_over_slo", "error_rate",
    "slo_breached", *(f"load_lag_{lag}m_per_replica" for lag in HISTORY_LAGS_MIN),
    *(f"forecast_{h}m_per_replica" for h in FORECAST_HORIZONS_MIN),
    "forecast_peak_per_replica", "upper_peak_per_replica", "spread_per_replica", "tod_sin", "tod_cos",
    "dow_sin", "dow_cos", "minute_of_hour_sin", "minute_of_hour_cos",
)
RATIO_CLIP = 5.0


def observation_features(context: PolicyContext, obs: Observation) -> np.ndarray:
    """The state for ``obs`` in :data:`FEATURE_LAYOUT` order (float32)."""
    replicas = max(obs.current_replicas, 1)
    last = obs.observed_minutes - 1
    history = context.forecast.last_observed
    lags = [history[last - lag + 1] if last - lag + 1 >= 0 else obs.load_replicas for lag in HISTORY_LAGS_MIN]
    if last >= 0:
        ahead = context.forecast.forecast(last, np.asarray(FORECAST_HORIZONS_MIN))
    else:
        ahead = np.full(len(FORECAST_HORIZONS_MIN), obs.load_replicas)
    minute_of_day = (context.start_minute_of_day + obs.minute) % 1440
    day = (context.start_weekday + (context.start_minute_of_day + obs.minute) // 1440) % 7
    values = [
        math.log1p(replicas) / math.log1p(100.0),
        obs.pending_replicas / replicas,
        obs.utilisation or 0.0,
        obs.load_replicas / replicas,
        min(obs.p99_latency_ms / context.service.slo_p99_ms, RATIO_CLIP),
        obs.error_rate,
        float(obs.slo_breached),
        *(x / replicas for x in lags),
        *(float(x) / replicas for x in ahead),
        forecast_needed_load(context, obs) / replicas,
        forecast_upper_load(context, obs) / replicas,
        forecast_spread(context, obs) / replicas,
        math.sin(2 * math.pi * minute_of_day / 1440), math.cos(2 * math.pi * minute_of_day / 1440),
        math.sin(2 * math.pi * day / 7), math.cos(2 * math.pi * day / 7),
        math.sin(2 * math.pi * (minute_of_day % 60) / 60), math.cos(2 * math.pi * (minute_of_day % 60) / 60),
    ]
    return np.clip(np.asarray(values, dtype=np.float32), -RATIO_CLIP, RATIO_CLIP)
