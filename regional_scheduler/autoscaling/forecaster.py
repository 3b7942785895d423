"""Seasonal-profile forecaster with a level correction (causal, vectorised over a whole series).

For a target minute ``T`` the *seasonal base* is the median, over the previous ``days`` days, of the
(5-minute centred mean) rate at the same minute of the day::

    base[T] = median_{d=1..days} smooth[T − d·1440]

and the forecast made at minute ``m`` (everything up to ``m`` observed) for ``T = m + h`` is::

    forecast(m, h) = level[m] × base[m + h],   level[m] = Σ rate[m−L+1..m] / Σ base[m−L+1..m]  (clipped)

The median makes the base robust to one odd day (a launch spike, a short dump file); the level ratio
tracks trend and weekday/weekend differences within half an hour. With less than a day of history the
forecast is persistence (the last observed rate).

Why this and not an LSTM/Transformer or Holt-Winters fitted by likelihood: the shared series have a
strong daily shape and few weeks of data (3-4 weeks, one with hourly steps), the forecast horizon that
matters is only the pod start-up delay plus a few minutes, and the benchmark also runs on series nobody
has seen. This model has no fitted weights to over-fit, costs a few vectorised passes, handles missing
minutes (NaN), and learns periodic spikes at fixed clock times (Twitter's odd-hour bursts) from the
previous days. Its residual uncertainty is handled downstream: the forecast policy's head-room is
calibrated on training days, and the DQN learns a state-dependent head-room on top of it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

MINUTES_PER_DAY = 1440


def _hold_last(values: np.ndarray) -> np.ndarray:
    known = np.isfinite(values)
    idx = np.where(known, np.arange(values.size), 0)
    np.maximum.accumulate(idx, out=idx)
    filled = values[idx]
    if known.any():
        filled[~np.isfinite(filled)] = values[known][0]
    else:
        filled[:] = 0.0
    return filled


def _centred_nanmean(values: np.ndarray, half_width: int) -> np.ndarray:
    known = np.isfinite(values)
    padded = np.pad(np.where(known, values, 0.0), half_width)
    counts = np.pad(known.astype(float), half_width)
    kernel = np.ones(2 * half_width + 1)
    total = np.convolve(padded, kernel, mode="valid")
    n = np.convolve(counts, kernel, mode="valid")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / n, np.nan)


def _centred_nanmax(values: np.ndarray, half_width: int) -> np.ndarray:
    padded = np.pad(np.where(np.isfinite(values), values, -np.inf), half_width, constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half_width + 1)
    peak = windows.max(axis=1)
    return np.where(np.isfinite(peak), peak, np.nan)


def _trailing_sum(values: np.ndarray, length: int) -> np.ndarray:
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, values.size + 1)
    return cumulative[idx] - cumulative[np.maximum(idx - length, 0)]


@dataclass(frozen=True)
class SeasonalForecast:
    """Precomputed seasonal base and level of one series; :meth:`forecast` is O(horizon)."""

    base: np.ndarray
    level: np.ndarray
    last_observed: np.ndarray
    spread: np.ndarray
    upper: np.ndarray

    def forecast(self, minute: int, horizons: np.ndarray) -> np.ndarray:
        """Forecasts made with minutes ``≤ minute`` known, for ``minute + horizons`` (persistence if no base)."""
        targets = np.clip(minute + horizons, 0, self.base.size - 1)
        seasonal = self.level[minute] * self.base[targets]
        return np.where(np.isfinite(seasonal), seasonal, self.last_observed[minute])

    def upper_peak(self, minute: int, first_horizon: int, last_horizon: int) -> float:
        """Highest *upper* seasonal forecast (recurring bursts) over horizons ``first..last``."""
        if minute < 0:
            return float("nan")
        targets = np.clip(minute + np.arange(first_horizon, last_horizon + 1), 0, self.upper.size - 1)
        values = self.level[minute] * self.upper[targets]
        return float(np.max(values)) if np.isfinite(values).any() else float("nan")

    def peak(self, minute: int, first_horizon: int, last_horizon: int) -> float:
        """Highest forecast over horizons ``first..last`` (inclusive)."""
        if minute < 0:
            return float("nan")
        return float(np.max(self.forecast(minute, np.arange(first_horizon, last_horizon + 1))))


@dataclass(frozen=True)
class SeasonalForecaster:
    """Hyper-parameters of the forecaster (see the module docstring)."""

    days: int = 7
    smoothing_half_width_min: int = 2
    level_window_min: int = 30
    level_clip: tuple[float, float] = (0.2, 5.0)
    spread_window_min: int = 60
    upper_quantile: float = 0.75

    def fit_transform(self, rate_per_minute: np.ndarray) -> SeasonalForecast:
        """Causal forecasts over a whole series (NaN = missing); index ``m`` uses only minutes ``≤ m``."""
        rate = np.asarray(rate_per_minute, dtype=float)
        smooth = _centred_nanmean(rate, self.smoothing_half_width_min)
        n = rate.size
        lagged = np.full((self.days, n), np.nan)
        for d in range(1, self.days + 1):
            shift = d * MINUTES_PER_DAY
            if shift < n:
                lagged[d - 1, shift:] = smooth[: n - shift]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            base = np.nanmedian(lagged, axis=0)
        # Upper seasonal base: the same days' upper quantile of the ±2-minute *maximum*, so a burst that
        # recurs at a clock time on a few of the days (Twitter's odd-hour bursts) shows up here even
        # when it misses the median.
        peaks = _centred_nanmax(rate, self.smoothing_half_width_min)
        lagged_peaks = np.full((self.days, n), np.nan)
        for d in range(1, self.days + 1):
            shift = d * MINUTES_PER_DAY
            if shift < n:
                lagged_peaks[d - 1, shift:] = peaks[: n - shift]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            upper = np.nanquantile(lagged_peaks, self.upper_quantile, axis=0)
        filled = _hold_last(rate)
        known = np.isfinite(rate) & np.isfinite(base)
        observed_sum = _trailing_sum(np.where(known, rate, 0.0), self.level_window_min)
        base_sum = _trailing_sum(np.where(known, base, 0.0), self.level_window_min)
        with np.errstate(invalid="ignore", divide="ignore"):
            level = np.where(base_sum > 1e-9, observed_sum / base_sum, 1.0)
        level = np.clip(level, *self.level_clip)
        # Spread: robust scale (1.4826 × median absolute one-minute-ahead error) over the last hour, the
        # noise a decision cannot see. The median keeps one burst from inflating the head-room for an hour.
        one_step = np.where(np.isfinite(base[1:]), level[:-1] * base[1:], filled[:-1])
        error = np.concatenate([[np.nan], np.abs(rate[1:] - one_step)])
        padded = np.concatenate([np.full(self.spread_window_min - 1, np.nan), error])
        windows = np.lib.stride_tricks.sliding_window_view(padded, self.spread_window_min)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            spread = 1.4826 * np.nanmedian(windows, axis=1)
        spread = np.where(np.isfinite(spread), spread, 0.0)
        return SeasonalForecast(base=base, level=level, last_observed=filled, spread=spread, upper=upper)
