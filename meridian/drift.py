"""Drift detection on the learned models' inputs and outcomes (issue 26, part 3).

A :class:`DriftMonitor` watches named series, one sample at a time (one a minute in the benchmarks),
with `river <https://riverml.xyz>`_'s maintained detectors, and raises a :class:`DriftAlert` naming the
feature, the detector and the sample index (and time, when given). Each alert increments
``meridian_drift_alerts_total{model,feature,detector}``, logs a WARNING naming the feature, and is handed
to a pluggable :class:`DriftPublisher` (the bus publisher, the retraining trigger), so the core never
imports a component.

Which detector watches what, and why:

* **ADWIN** (Bifet and Gavaldà 2007) for a change of **mean**: it keeps an adaptive window and cuts it
  where two sub-windows' means differ by more than a Hoeffding/Bernstein bound at confidence ``delta``.
  It needs no reference and no direction, and it forgets the old regime by itself after a cut. Used for
  levels that can move either way: the pod request mix, node utilisation, carbon intensity, request rate.
* **KSWIN** (Raab, Heusinger and Schleif 2020) for a change of **distribution shape**: a two-sample
  Kolmogorov-Smirnov test between the newest ``stat_size`` samples and a random draw from the older
  window. It sees changes a mean test cannot: a gpushare pod list replaced by a multigpu one at a similar
  mean GPU request, a grid whose carbon profile flattens or splits into two modes. Used on the pod
  request mix and carbon intensity. It costs a KS test per update, so it sees every ``kswin_every``-th
  sample (a shape is not a minute-scale property).
* **Page-Hinkley** (Page 1954; Hinkley 1971; a CUSUM against the running mean) for a **one-sided
  trend**: it accumulates small persistent deviations in one direction, so it detects a slow creep that
  a two-window mean test only sees late, and it ignores improvements. Used on outcomes, where only a
  worsening matters: the fragmentation trend, the forecast error, SLO violations.

Series with a daily cycle (carbon intensity, request rate) are **deseasonalised** before any detector sees
them: the first ``season_samples`` form a daily profile (smoothed by a circular moving average) that is
subtracted from every later sample; the residual is stationary on an unchanged regime, while a shifted
or reshaped day shows in it for as long as it lasts (a lag difference would show it for one day only and
raise a second alert when it returned). Every series is then standardised by its warm-up mean and
standard deviation, so the Page-Hinkley ``delta`` and ``threshold`` are in standard deviations.

Thresholds (``DriftSettings``) were chosen so that a stationary simulated week (10,080 one-minute samples
per feature) raises at most one false alarm per tier; the measured false-alarm counts and detection
delays, and the test that measures them, are in ``docs/drift-and-gates.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry
from pydantic import BaseModel, Field
from river import drift

from meridian.observability import counter

log = logging.getLogger(__name__)


class Detector(StrEnum):
    ADWIN = "adwin"
    KSWIN = "kswin"
    PAGE_HINKLEY = "page_hinkley"


class DriftSettings(BaseModel):
    """Detector thresholds; each default is the one measured in docs/drift-and-gates.md."""

    adwin_delta: float = Field(1e-5, gt=0, lt=1, description="ADWIN's confidence parameter: a cut needs the "
                               "two sub-windows' means to differ beyond a bound holding with 1 − delta. "
                               "river's default 0.002 raised 2-3 false alarms in 2 of 4 stationary weeks of the "
                               "deseasonalised request rate (its noise varies over the day); 1e-5 raised none in "
                               "20 weeks and still detects a 1-std mean shift within ~100 samples.")
    kswin_alpha: float = Field(1e-5, gt=0, lt=1, description="KSWIN's KS-test level. It is tested at every "
                               "(sub-sampled) step, so it must be small: ~2000 tests a week at 1e-5.")
    kswin_window: int = Field(200, ge=20, description="KSWIN's window in (sub-sampled) samples: 200 × 5 minutes, "
                              "about 17 hours of reference.")
    kswin_stat_size: int = Field(60, ge=10, description="Newest samples KSWIN compares with the older window: "
                             "60 × 5 minutes = 5 hours, enough for a KS test to resolve a shape change.")
    kswin_every: int = Field(5, ge=1, description="KSWIN sees every n-th sample: a KS test per minute costs ~1 ms "
                             "per feature, and a shape is not a minute-scale property.")
    page_hinkley_delta: float = Field(0.5, ge=0, description="Page-Hinkley's drift allowance in standard "
                                      "deviations: half the 1-std shift it is tuned to detect (the CUSUM rule "
                                      "k = shift / 2).")
    page_hinkley_threshold: float = Field(25.0, gt=0, description="Page-Hinkley's alarm level in standard "
                                          "deviations. For a CUSUM with k = 0.5 the in-control run length grows as "
                                          "exp(2k·h): 25 keeps skewed outcome series (SLO violations are mostly "
                                          "zeros) below one false alarm a week while a 1-std rise is detected "
                                          "in ~50 samples.")
    page_hinkley_min_instances: int = Field(60, ge=1, description="Samples after a reset before Page-Hinkley "
                                            "tests (its running mean must settle).")
    warmup_samples: int = Field(1440, ge=10, description="Samples (a day at one a minute) that fix each series' "
                                "standardisation before any detector runs.")
    smoothing_samples: int = Field(31, ge=1, description="Width of the circular moving average smoothing a "
                                   "seasonal profile: 31 minutes averages out the noise of a single reference day "
                                   "while keeping an hourly shape.")
    cooldown_samples: int = Field(720, ge=0, description="After an alert, the same detector on the same feature "
                                  "is silent this long (raw samples: 12 hours at one a minute): one change is one "
                                  "alert, not a burst while the detector re-adapts (ADWIN cut a doubled request "
                                  "rate three times in its first 5 hours), and the retraining the first alert "
                                  "triggers takes longer than that anyway.")
    seed: int = Field(0, description="Seed of KSWIN's random reference draws (per feature: seed + its index).")


@dataclass(frozen=True)
class FeatureSpec:
    """A watched series: its detectors, its daily season (samples; None: none), a floor on its standard
    deviation in its own units (a mostly-zero warm-up must not make one violation look like 100 std), and
    how many consecutive samples are averaged into one before the detectors see it (a rare-event series
    such as SLO-violation minutes is too skewed per minute: a chance cluster of violations looks like a
    trend, and a small rise of the rate is well under a per-minute standard deviation)."""

    name: str
    detectors: tuple[Detector, ...]
    season_samples: int | None = None
    min_std: float = 0.0
    aggregate: int = 1

    def __post_init__(self) -> None:
        if self.aggregate < 1 or (self.season_samples and self.season_samples % self.aggregate):
            raise ValueError(f"{self.name}: aggregate must be ≥ 1 and divide season_samples")


#: The default features, per tier (the justification of each detector is the module docstring's).
TIER_FEATURES: dict[str, tuple[FeatureSpec, ...]] = {
    "placement": (
        FeatureSpec("pod_request_mix", (Detector.ADWIN, Detector.KSWIN)),
        FeatureSpec("node_utilisation", (Detector.ADWIN,)),
        FeatureSpec("fragmentation_trend", (Detector.PAGE_HINKLEY,)),
    ),
    "routing": (
        FeatureSpec("carbon_intensity", (Detector.ADWIN, Detector.KSWIN), season_samples=1440),
        FeatureSpec("slo_violations", (Detector.PAGE_HINKLEY,), min_std=0.02, aggregate=15),
    ),
    "autoscaling": (
        FeatureSpec("request_rate", (Detector.ADWIN,), season_samples=1440, aggregate=15),
        FeatureSpec("forecast_error", (Detector.PAGE_HINKLEY,)),
        FeatureSpec("slo_violations", (Detector.PAGE_HINKLEY,), min_std=0.02, aggregate=15),
    ),
}


@dataclass(frozen=True)
class DriftAlert:
    model: str
    feature: str
    detector: Detector
    sample_index: int  # index of the sample in this feature's series (0-based)
    time_s: float | None
    value: float


class DriftPublisher(Protocol):
    """Where alerts go besides the metric and the log: the bus, a retraining trigger."""

    def __call__(self, alert: DriftAlert) -> None: ...


ADWIN_CLOCK = 32  # river's default: ADWIN looks for a cut every 32 samples


def _build_detector(kind: Detector, settings: DriftSettings, seed: int,
                    aggregate: int = 1) -> drift.ADWIN | drift.KSWIN | drift.PageHinkley:
    if kind is Detector.ADWIN:
        # Every 32 raw samples, whatever the aggregation: 32 means of 15 minutes would be 8 hours between looks.
        return drift.ADWIN(delta=settings.adwin_delta, clock=max(1, ADWIN_CLOCK // aggregate))
    if kind is Detector.KSWIN:
        return drift.KSWIN(alpha=settings.kswin_alpha, window_size=settings.kswin_window,
                           stat_size=settings.kswin_stat_size, seed=seed)
    return drift.PageHinkley(min_instances=settings.page_hinkley_min_instances, delta=settings.page_hinkley_delta,
                             threshold=settings.page_hinkley_threshold, mode="up")


def seasonal_profile(reference: np.ndarray, smoothing: int) -> np.ndarray:
    """One season's profile: ``reference`` (one value per slot) smoothed by a circular moving average."""
    width = max(1, min(smoothing, reference.size))
    half = width // 2
    padded = np.concatenate([reference[-half:] if half else reference[:0], reference, reference[:width - 1 - half]])
    return np.convolve(padded, np.ones(width) / width, mode="valid")


@dataclass
class _FeatureState:
    spec: FeatureSpec
    settings: DriftSettings
    seed: int
    index: int = 0  # raw samples seen
    step: int = 0  # aggregated samples seen
    pending: list[float] = field(default_factory=list)
    warmup: list[float] = field(default_factory=list)
    profile: np.ndarray | None = None
    mean: float = 0.0
    std: float = 1.0
    ready: bool = False
    detectors: dict[Detector, drift.ADWIN | drift.KSWIN | drift.PageHinkley] = field(default_factory=dict)
    last_alert: dict[Detector, int] = field(default_factory=dict)

    @property
    def season(self) -> int | None:
        """The season in aggregated samples."""
        return self.spec.season_samples // self.spec.aggregate if self.spec.season_samples else None

    @property
    def warmup_length(self) -> int:
        """Warm-up in aggregated samples."""
        return -(-max(self.settings.warmup_samples, self.spec.season_samples or 0) // self.spec.aggregate)

    def _finish_warmup(self) -> None:
        values = np.asarray(self.warmup, dtype=float)
        season = self.season
        if season:
            # The last full season of the warm-up is the profile; slot = sample index mod season.
            start = values.size - season
            slots = (np.arange(start, values.size)) % season
            reference = np.empty(season)
            reference[slots] = values[start:]
            # The smoothing is in raw samples: in aggregated slots it is that many times narrower (kept odd, so
            # the average is centred), or a profile of 15-minute slots would be smoothed over ~8 hours.
            width = max(1, self.settings.smoothing_samples // self.spec.aggregate)
            self.profile = seasonal_profile(reference, width + 1 - width % 2)
            values = values - self.profile[np.arange(values.size) % season]
        self.mean = float(values.mean())
        self.std = max(float(values.std()), self.spec.min_std, 1e-12)
        self.detectors = {kind: _build_detector(kind, self.settings, self.seed, self.spec.aggregate)
                          for kind in self.spec.detectors}
        self.warmup.clear()
        self.ready = True

    def residual(self, value: float, index: int) -> float:
        if self.profile is not None and self.season:
            value -= float(self.profile[index % self.season])
        return (value - self.mean) / self.std

    def update(self, value: float) -> list[Detector]:
        """Feed one raw sample; the detectors that fired on it (after the cooldown)."""
        raw_index = self.index
        self.index += 1
        self.pending.append(value)
        if len(self.pending) < self.spec.aggregate:
            return []
        value = sum(self.pending) / len(self.pending)
        self.pending.clear()
        step = self.step
        self.step += 1
        if not self.ready:
            self.warmup.append(value)
            if len(self.warmup) >= self.warmup_length:
                self._finish_warmup()
            return []
        z = self.residual(value, step)
        fired = []
        for kind, detector in self.detectors.items():
            if kind is Detector.KSWIN and step % self.settings.kswin_every:
                continue
            detector.update(z)
            if detector.drift_detected and raw_index - self.last_alert.get(kind, -10**12) >= self.settings.cooldown_samples:
                self.last_alert[kind] = raw_index
                fired.append(kind)
        return fired


class DriftMonitor:
    """Drift detectors over one model's named inputs and outcomes."""

    def __init__(self, model: str, features: Sequence[FeatureSpec], *, settings: DriftSettings | None = None,
                 publish: DriftPublisher | None = None, registry: CollectorRegistry = REGISTRY) -> None:
        self.model = model
        self.settings = settings or DriftSettings()
        self.publish = publish
        names = [spec.name for spec in features]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate feature names: {names}")
        self._states = {spec.name: _FeatureState(spec, self.settings, self.settings.seed + i)
                        for i, spec in enumerate(features)}
        self._alerts_total = counter("meridian_drift_alerts_total", "Drift alerts raised, by model, feature and "
                                     "detector.", ("model", "feature", "detector"), registry=registry)
        self.alerts: list[DriftAlert] = []

    @classmethod
    def for_tier(cls, tier: str, model: str | None = None, *, settings: DriftSettings | None = None,
                 publish: DriftPublisher | None = None, registry: CollectorRegistry = REGISTRY) -> DriftMonitor:
        """The monitor with a tier's default features (:data:`TIER_FEATURES`)."""
        return cls(model or tier, TIER_FEATURES[tier], settings=settings, publish=publish, registry=registry)

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(self._states)

    def update(self, feature: str, value: float, time_s: float | None = None) -> list[DriftAlert]:
        """One sample of ``feature``; the alerts it raised (usually none)."""
        state = self._states[feature]
        index = state.index
        alerts = [DriftAlert(self.model, feature, kind, index, time_s, float(value))
                  for kind in state.update(float(value))]
        for alert in alerts:
            self._raise(alert)
        return alerts

    def update_many(self, feature: str, values: Iterable[float],
                    times_s: Iterable[float] | None = None) -> list[DriftAlert]:
        """Consecutive samples of one feature (river's detectors are sequential: one update per sample)."""
        series = np.asarray(list(values), dtype=float)
        times = np.asarray(list(times_s), dtype=float) if times_s is not None else None
        out: list[DriftAlert] = []
        for i, value in enumerate(series.tolist()):
            out.extend(self.update(feature, value, None if times is None else float(times[i])))
        return out

    def _raise(self, alert: DriftAlert) -> None:
        self.alerts.append(alert)
        self._alerts_total.labels(model=alert.model, feature=alert.feature, detector=str(alert.detector)).inc()
        log.warning("drift detected: model=%s feature=%s detector=%s sample=%d time_s=%s value=%.6g",
                    alert.model, alert.feature, alert.detector, alert.sample_index, alert.time_s, alert.value)
        if self.publish is not None:
            self.publish(alert)
