"""Autoscaler settings: nested, typed, each field documented with its unit and why this default.

Read from the environment with the prefix ``MERIDIAN_AUTOSCALER_`` and ``__`` between levels, e.g.
``MERIDIAN_AUTOSCALER_SERVICE__STARTUP_DELAY_S=90`` or ``MERIDIAN_AUTOSCALER_SIZING__MIN_REPLICAS=2``.
The guard rails take their bounds from the sizing (min/max replicas); their 50 % and 3-minute limits
are the issue's and fixed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseModel):
    """The simulated service: a queue per replica, pod start-up and metrics pipeline delays."""

    tick_s: float = Field(15.0, gt=0, description="Simulation step in seconds; 15 s is the HPA sync period "
                          "(--horizontal-pod-autoscaler-sync-period) so the HPA is evaluated exactly as often as "
                          "in a cluster.")
    startup_delay_s: float = Field(60.0, ge=0, description="Seconds from a scale-up to the new pod serving "
                                   "(image pull, JVM/model warm-up, readiness probe). 60 s is the issue's default.")
    metrics_delay_s: float = Field(15.0, ge=0, description="Seconds between a sample and the moment a controller "
                                   "sees it; one metrics-server scrape (resolution 15 s).")
    metrics_window_s: float = Field(30.0, gt=0, description="Seconds averaged in one metric sample, as the "
                                    "kubelet/metrics-server CPU rate window.")
    service_time_ms: float = Field(100.0, gt=0, description="Milliseconds one request takes on an idle worker "
                                   "(its CPU time at one core); a typical small web/API request.")
    workers_per_replica: int = Field(4, ge=1, description="Concurrent workers (one per core) in a replica; the "
                                     "replica is an M/M/c queue with c = this. A pod requesting 4 CPU.")
    slo_p99_ms: float = Field(500.0, gt=0, description="Latency SLO on the p99 in milliseconds. With 4 workers "
                              "and 100 ms service time it is breached above ~0.76 utilisation, 27% above the "
                              "HPA's 0.6 target: the usual 'react before saturation' head-room.")
    timeout_s: float = Field(10.0, gt=0, description="Seconds a request may wait in the queue before it is "
                             "dropped (counted as an error).")
    max_error_rate: float = Field(0.01, ge=0, le=1, description="A minute whose dropped fraction exceeds this "
                                  "violates the SLO even if latency is fine.")


class SizingSettings(BaseModel):
    """How a request series becomes a service, identically for every series (no per-series tuning)."""

    target_utilisation: float = Field(0.6, gt=0, lt=1, description="Target CPU utilisation (fraction of "
                                      "requested CPU) for the HPA and for sizing; 60% is a common production "
                                      "HPA target.")
    reference_replicas: int = Field(20, ge=1, description="Replicas needed, at the target utilisation, for the "
                                    "training days' 99th-percentile minute. Fixes capacity per replica from the "
                                    "series' own statistics so any series maps to a service of the same shape.")
    reference_quantile: float = Field(0.99, gt=0, le=1, description="Quantile of the training days' per-minute "
                                      "rate that `reference_replicas` must serve at the target utilisation.")
    min_replicas: int = Field(1, ge=0, description="Floor on replicas (HPA minReplicas).")
    max_replicas_factor: float = Field(5.0, gt=1, description="maxReplicas = this × reference_replicas; spikes "
                                       "beyond the 99th percentile need head-room.")


class GuardRailSettings(BaseModel):
    """Hard limits applied after any policy (learned or forecast) before a decision is actuated."""

    min_replicas: int = Field(1, ge=0, description="Never fewer replicas than this.")
    max_replicas: int = Field(100, ge=1, description="Never more replicas than this.")
    max_scale_down_fraction: float = Field(0.5, gt=0, le=1, description="A single decision removes at most "
                                           "this fraction of the current replicas (50%).")
    scale_down_cooldown_s: float = Field(180.0, ge=0, description="Seconds that must pass between two "
                                         "scale-downs (3 min).")
    breach_target_utilisation: float = Field(0.6, gt=0, lt=1, description="On an SLO breach the rail scales up "
                                             "at once to ceil(current × utilisation / this), at least +1.")


class BudgetSettings(BaseModel):
    """The online replica-hours budget of the ``quantile-budget`` policy: spend what the HPA would.

    A shadow HPA (the exact algorithm, replayed on the load as it is observed) says how many replicas the
    HPA would be running; the policy banks what it spends less than ``ratio`` × that and spends the
    balance by provisioning for higher quantiles, so a budget matched on past days cannot leave budget
    unused on new ones. Defaults chosen on the validation split (docs/autoscaling.md, "Choosing it").
    """

    ratio: float = Field(1.03, gt=0, description="Replica-hours allowed relative to the shadow HPA's. 1.03, as "
                         "the forecast policy's calibration: inside the benchmark's 1.05 with room for the "
                         "bank's lag. 1.0 means 'no more than the HPA it replaces'.")
    minutes_per_level: float = Field(12.0, gt=0, description="Banked minutes of the HPA's mean spend that buy "
                                     "one step up the quantile grid (e.g. τ 0.95 → 0.97) for both scale-up and "
                                     "scale-down. Validation: 6, 12 and 24 gave the same violations within "
                                     "noise.")
    max_levels: int = Field(6, ge=0, description="At most this many steps up the grid, however large the "
                            "balance (a long quiet spell must not buy a 0.999 quantile for a week).")
    memory_days: float = Field(7.0, gt=0, description="Days after which a saving or an overspend is forgotten "
                               "(the bank leaks with this time constant): one weekly cycle.")


class SplitSettings(BaseModel):
    """Which days train the learned policy and which are held back for evaluation."""

    held_back_fraction: float = Field(0.25, gt=0, lt=1, description="Fraction of whole days, taken from the end "
                                      "of the series, never used for training or calibration.")


class KedaSettings(BaseModel):
    """The KEDA external scaler gRPC server."""

    address: str = Field("0.0.0.0:9090", description="host:port the gRPC server listens on.")
    metric_name: str = Field("meridian-desired-replicas", description="External metric name reported to KEDA.")
    stream_interval_s: float = Field(15.0, gt=0, description="Seconds between StreamIsActive updates.")


class AutoscalerSettings(BaseSettings):
    """All autoscaler settings; environment variables override the defaults."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_AUTOSCALER_", env_nested_delimiter="__")

    service: ServiceSettings = ServiceSettings()
    sizing: SizingSettings = SizingSettings()
    split: SplitSettings = SplitSettings()
    keda: KedaSettings = KedaSettings()
    budget: BudgetSettings = BudgetSettings()
    policy: Literal["hpa", "forecast", "quantile", "quantile-budget", "learned"] = Field(
        "quantile-budget", description="Live policy of the serving loop.")
    shadow_policy: Literal["hpa", "forecast", "quantile", "quantile-budget", "learned"] | None = Field(
        None, description="Policy run beside the live one in shadow mode (recorded, never actuated).")
