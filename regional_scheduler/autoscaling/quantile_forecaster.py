"""Short-horizon quantile forecaster: the load of the next one or two minutes, at several quantiles.

What a scale decision has to cover is not "the load", but the load of the minute new pods would first
serve (one or two minutes ahead: metrics are a scrape late and pods start in 60 s) — and at a chosen
risk of being exceeded. This module learns, per series and from its **training days only**, the
conditional quantiles of that load:

    Q_τ(load[t + h] | minutes ≤ t) = s_t × w_{h,τ} · x_t        h ∈ {1, 2},  τ ∈ TAUS

(and the same for the peak of the next :data:`PEAK_MINUTES` minutes, what a scale-down must keep) with
``s_t`` the mean of the last 30 observed minutes, at least one request a minute, and ``x_t``
scale-free features (:data:`FEATURES`: recent lags, maxima, means and EWMAs, the seasonal forecast and
its upper band at the target minute, the raw seasonal-naive change to it, the previous hours' burst at
the same minute of the hour, Poisson quantiles of the recent rate, ``1/sqrt(requests per minute)``).
One linear model per ``(target, τ)``, fitted with the pinball (quantile) loss.

:func:`poisson_forecast` is the second family: no fitted weights, the next minutes' requests Poisson
around the recent rate. :func:`..calibration.fit_quantile_policy` picks a family per series on its
training days.

Why this model: the minute-level shared series are noise-dominated (a one-step error of ~30 % of the
mean) and their noise is heteroscedastic (a few requests a minute on the LoRA trace, bursts 4× the
base on Twitter at recurring minutes of the hour). A quantile model states *how likely* a replica count
is to be exceeded, which is what the SLO-minute count measures, instead of a point forecast plus a
global head-room. Linear in scale-free features keeps it small (22 weights per quantile), fast to fit
on a few weeks and unable to memorise a series; features are causal (only minutes ``≤ t``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from regional_scheduler.autoscaling.forecaster import SeasonalForecast

#: Quantile levels learned; a policy picks one of them (calibrated on training days).
TAUS: tuple[float, ...] = (0.5, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)
HORIZONS: tuple[int, ...] = (1, 2)
#: Extra target: the peak of minutes ``t+1 .. t+PEAK_MINUTES`` (what a scale-down has to keep covering).
PEAK_MINUTES = 4
FEATURES: tuple[str, ...] = (
    "bias", "last", "lag1", "lag2", "max5", "max10", "mean30", "mean60", "seasonal", "seasonal_upper",
    "seasonal_trend", "upper_over_base", "spread", "poisson_scale", "burst_lag60", "burst_lag120",
    "seasonal_naive", "seasonal_naive_change", "ewma3", "ewma30", "poisson_q90", "poisson_q97",
)
SCALE_MINUTES = 30
FEATURE_CLIP = 20.0


def _trailing(values: np.ndarray, length: int, reduce: str) -> np.ndarray:
    padded = np.concatenate([np.full(length - 1, values[0]), values])
    windows = np.lib.stride_tricks.sliding_window_view(padded, length)
    return windows.max(axis=1) if reduce == "max" else windows.mean(axis=1)


def _ewma(values: np.ndarray, half_life_min: float) -> np.ndarray:
    """Exponentially weighted mean up to each minute (causal), as a linear filter."""
    alpha = 1.0 - 0.5 ** (1.0 / half_life_min)
    out = np.empty(values.size)
    acc = float(values[0])
    for i, v in enumerate(values.tolist()):
        acc += alpha * (v - acc)
        out[i] = acc
    return out


def poisson_quantile(rate: np.ndarray, q: float, exact_below: float = 60.0) -> np.ndarray:
    """The q-quantile of Poisson(rate), elementwise: exact below ``exact_below`` (CDF summed over k),
    the normal approximation with continuity correction above (error under one count there)."""
    rate = np.maximum(np.asarray(rate, dtype=float), 1e-9)
    k_max = int(exact_below + 10 * np.sqrt(exact_below) + 10)
    k = np.arange(k_max + 1)
    small = np.minimum(rate, exact_below)
    log_pmf = k[None, :] * np.log(small[:, None]) - small[:, None] - np.cumsum(np.log(np.maximum(k, 1)))[None, :]
    cdf = np.cumsum(np.exp(log_pmf), axis=1)
    exact = np.minimum((cdf < q).sum(axis=1), k_max).astype(float)
    z = float(np.sqrt(2.0) * torch.erfinv(torch.tensor(2.0 * q - 1.0, dtype=torch.float64)))
    approx = np.ceil(rate + z * np.sqrt(rate) - 0.5)
    return np.where(rate <= exact_below, exact, approx)


def _shift(values: np.ndarray, by: int, fill: float = np.nan) -> np.ndarray:
    """``out[t] = values[t − by]`` (``by`` > 0 looks back, < 0 looks ahead)."""
    out = np.full(values.size, fill)
    if by >= 0:
        out[by:] = values[: values.size - by]
    else:
        out[:by] = values[-by:]
    return out


def _burst_at_lag(filled: np.ndarray, lag: int, h: int) -> np.ndarray:
    """For target ``t + h``: the peak around ``t + h − lag`` over the 10 minutes before it, both known at
    ``t`` (``lag`` ≥ 60 > h + 1): a burst at the same minute of the hour one or two hours ago."""
    peak = np.maximum(np.maximum(_shift(filled, lag - h - 1), _shift(filled, lag - h)), _shift(filled, lag - h + 1))
    before = _shift(_trailing(filled, 10, "mean"), lag - h + 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = peak / np.maximum(before, 1e-9)
    return np.where(np.isfinite(ratio), ratio, 1.0)


def _seasonal_median(filled: np.ndarray, at: np.ndarray, days: int = 7) -> np.ndarray:
    """Median over the previous ``days`` days of the raw (unsmoothed) load at minutes ``at − d·1440``."""
    lagged = np.full((days, at.size), np.nan)
    for d in range(1, days + 1):
        src = at - d * 1440
        ok = src >= 0
        lagged[d - 1, ok] = filled[src[ok]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return np.nanmedian(lagged, axis=0)


def quantile_features(filled: np.ndarray, forecast: SeasonalForecast, capacity_per_replica_rpm: float,
                      h: int) -> tuple[np.ndarray, np.ndarray]:
    """``(X, s)``: features ``X[t]`` (len(FEATURES)) and scale ``s[t]`` for a forecast made at minute ``t``
    of the load at ``t + h``. ``filled`` is the load in replicas with missing minutes held."""
    n = filled.size
    # Scale: the last half hour's mean, at least one request a minute (on a trace of ~1 request a minute a
    # 10-minute mean is often 0 and every ratio would explode).
    scale = np.maximum(_trailing(filled, SCALE_MINUTES, "mean"), 1.0 / capacity_per_replica_rpm)
    target = np.clip(np.arange(n) + h, 0, n - 1)
    base_now = forecast.base
    with np.errstate(invalid="ignore", divide="ignore"):
        seasonal = forecast.level * forecast.base[target]
        seasonal = np.where(np.isfinite(seasonal), seasonal, filled)
        upper = forecast.level * forecast.upper[target]
        upper = np.where(np.isfinite(upper), upper, seasonal)
        trend = forecast.base[target] / base_now
        upper_over_base = forecast.upper[target] / forecast.base[target]
    # Seasonal-naive change from now to the target (raw minutes, no smoothing: an hourly series steps
    # exactly at the hour, and the smoothed base would spread that step over five minutes).
    now = np.arange(n)
    # Requests a minute expected from the last few minutes: on a trace of ~1 request a minute the next
    # minute's count is Poisson around it, and its quantiles are whole requests (each worth several
    # replicas), which no linear function of the rate itself can express.
    recent_requests = _ewma(filled, 3.0) * capacity_per_replica_rpm
    with np.errstate(invalid="ignore", divide="ignore"):
        naive_ratio = _seasonal_median(filled, target) / _seasonal_median(filled, now)
    naive_ratio = np.clip(np.where(np.isfinite(naive_ratio), naive_ratio, 1.0), 0.0, FEATURE_CLIP)
    columns = [
        np.ones(n), filled, _shift(filled, 1, filled[0]), _shift(filled, 2, filled[0]),
        _trailing(filled, 5, "max"), _trailing(filled, 10, "max"), _trailing(filled, 30, "mean"),
        _trailing(filled, 60, "mean"), seasonal, upper,
    ]
    x = np.stack([c / scale if i > 0 else c for i, c in enumerate(columns)], axis=1)
    extra = np.stack([
        np.where(np.isfinite(trend), trend, 1.0),
        np.where(np.isfinite(upper_over_base), upper_over_base, 1.0),
        forecast.spread / scale,
        1.0 / np.sqrt(np.maximum(scale * capacity_per_replica_rpm, 1e-3)),
        _burst_at_lag(filled, 60, h),
        _burst_at_lag(filled, 120, h),
        naive_ratio * filled / scale,
        np.abs(naive_ratio - 1.0),
        _ewma(filled, 3.0) / scale,
        _ewma(filled, 30.0) / scale,
        poisson_quantile(recent_requests, 0.9) / capacity_per_replica_rpm / scale,
        poisson_quantile(recent_requests, 0.97) / capacity_per_replica_rpm / scale,
    ], axis=1)
    features = np.concatenate([x, extra], axis=1)
    return np.clip(np.nan_to_num(features, nan=1.0), -FEATURE_CLIP, FEATURE_CLIP), scale


def fit_pinball(x: np.ndarray, y: np.ndarray, taus: tuple[float, ...], *, steps: int, seed: int) -> np.ndarray:
    """Weights ``(len(taus), k)`` minimising the mean pinball loss of ``x @ w`` for each τ (full batch).

    Columns are standardised for the optimiser (the pinball loss is flat in badly scaled directions) and
    the start is the (ridge) least-squares fit shifted to each τ's empirical residual quantile, so Adam only has
    to refine a reasonable model."""
    torch.manual_seed(seed)
    # Reproducible across processes: the fit must not depend on where its inputs live in memory. LAPACK's
    # least-squares driver (gelsy) did (the same inputs at other addresses gave other solutions on this
    # ill-conditioned design: a near-constant standardised column), and the pinball loss's kinks amplify
    # any difference over the optimisation. So: torch copies (64-byte aligned), statistics in torch, and
    # the start from ridge-regularised normal equations (a 22×22 solve), rounded — checked identical over
    # memory layouts and processes (tests/regional_scheduler/autoscaling/test_quantile_policy.py).
    xt = torch.tensor(x, dtype=torch.float64)
    yt = torch.tensor(y, dtype=torch.float64)[:, None]
    mean_t = xt[:, 1:].mean(dim=0)
    std_t = xt[:, 1:].std(dim=0, unbiased=False).clamp(min=1e-6)
    zt = torch.cat([xt[:, :1], (xt[:, 1:] - mean_t) / std_t], dim=1)
    mean, std = mean_t.numpy(), std_t.numpy()
    tau = torch.as_tensor(taus, dtype=torch.float64)[None, :]
    gram = zt.T @ zt
    ridge = 1e-6 * torch.trace(gram) / gram.shape[0]
    start = torch.round(torch.linalg.solve(gram + ridge * torch.eye(gram.shape[0], dtype=torch.float64),
                                           zt.T @ yt), decimals=8)  # (k, 1)
    residual = (yt - zt @ start).squeeze(1).numpy()
    w0 = start.repeat(1, len(taus))
    w0[0, :] += torch.as_tensor(np.round(np.quantile(residual, taus), 8), dtype=torch.float64)
    w = w0.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([w], lr=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)
    for _ in range(steps):
        optimiser.zero_grad()
        residual_t = yt - zt @ w
        loss = torch.maximum(tau * residual_t, (tau - 1.0) * residual_t).mean()
        loss.backward()
        optimiser.step()
        schedule.step()
    fitted = w.detach().numpy()  # standardised space → raw feature space
    raw = fitted.copy()
    raw[1:] = fitted[1:] / std[:, None]
    raw[0] = fitted[0] - (mean[:, None] * raw[1:]).sum(axis=0)
    return raw.T.copy()


@dataclass(frozen=True)
class QuantileForecast:
    """Precomputed quantile forecasts of one series: ``values[h_index, tau_index, t]`` (load in replicas)."""

    values: np.ndarray
    taus: tuple[float, ...]
    horizons: tuple[int, ...]
    weights: np.ndarray  # (len(horizons), len(taus), len(FEATURES))

    def quantile(self, minute: int, horizon: int, tau: float) -> float:
        """τ-quantile of the load at ``minute + horizon`` made with minutes ``≤ minute`` known."""
        h = min(max(horizon, self.horizons[0]), self.horizons[-1])
        t = min(max(minute, 0), self.values.shape[2] - 1)
        return float(self.values[self.horizons.index(h), self.taus.index(tau), t])

    def peak_quantile(self, minute: int, tau: float) -> float:
        """τ-quantile of the highest load over the next :data:`PEAK_MINUTES` minutes."""
        t = min(max(minute, 0), self.values.shape[2] - 1)
        return float(self.values[-1, self.taus.index(tau), t])


def poisson_forecast(filled: np.ndarray, capacity_per_replica_rpm: float, *, taus: tuple[float, ...] = TAUS,
                     horizons: tuple[int, ...] = HORIZONS, half_life_min: float = 5.0) -> QuantileForecast:
    """The count model: the next minutes' requests are Poisson around an exponentially weighted mean of
    the last minutes (half-life ``half_life_min``); quantiles are whole requests converted to replicas.
    The peak of the next :data:`PEAK_MINUTES` minutes (independent draws) exceeds its τ-quantile when one
    of them exceeds the ``τ^(1/PEAK_MINUTES)``-quantile. Nothing is fitted: it suits traces of a few
    requests a minute, where counting noise is most of what there is to forecast."""
    rate = _ewma(filled, half_life_min) * capacity_per_replica_rpm
    values = np.empty((len(horizons) + 1, len(taus), filled.size))
    for i, tau in enumerate(taus):
        per_minute = poisson_quantile(rate, tau) / capacity_per_replica_rpm
        values[: len(horizons), i] = per_minute
        values[-1, i] = poisson_quantile(rate, tau ** (1.0 / PEAK_MINUTES)) / capacity_per_replica_rpm
    return QuantileForecast(values=values, taus=taus, horizons=horizons,
                            weights=np.zeros((len(horizons) + 1, len(taus), 0)))


@dataclass(frozen=True)
class QuantileForecaster:
    """Fits the linear quantile models on ``[fit_start, fit_end)`` and predicts for every minute."""

    taus: tuple[float, ...] = TAUS
    horizons: tuple[int, ...] = HORIZONS
    steps: int = 1500
    seed: int = 0
    skip_first_minutes: int = 1440  # the seasonal features need a day of history

    def fit_transform(self, load: np.ndarray, forecast: SeasonalForecast, capacity_per_replica_rpm: float,
                      fit_end: int, fit_start: int = 0) -> QuantileForecast:
        """Fit on targets inside ``[fit_start, fit_end)`` (observed minutes only), predict for all ``t``.

        Forecasts at any ``t`` use features of minutes ``≤ t`` only; ``fit_end`` bounds what the weights
        saw, so held-back minutes never shape the model."""
        filled = forecast.last_observed
        observed = np.isfinite(np.asarray(load, dtype=float))
        n = filled.size
        t = np.arange(n)
        weights = np.empty((len(self.horizons) + 1, len(self.taus), len(FEATURES)))
        lo = max(fit_start, self.skip_first_minutes if fit_end - self.skip_first_minutes > 2880 else 0)
        ahead = np.stack([filled[np.clip(t + k, 0, n - 1)] for k in range(1, PEAK_MINUTES + 1)])
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a 16-column regression: threads only add contention
        try:
            for i, h in enumerate(self._targets()):
                x, scale = quantile_features(filled, forecast, capacity_per_replica_rpm, h or 2)
                last = h or PEAK_MINUTES
                y = (filled[np.clip(t + h, 0, n - 1)] if h else ahead.max(axis=0)) / scale
                rows = (t >= lo) & (t + last < fit_end) & observed & observed[np.clip(t + last, 0, n - 1)]
                weights[i] = fit_pinball(x[rows], np.minimum(y[rows], FEATURE_CLIP), self.taus, steps=self.steps,
                                          seed=self.seed)
        finally:
            torch.set_num_threads(threads)
        return self.predict(weights, forecast, capacity_per_replica_rpm)

    def _targets(self) -> list[int]:
        return [*self.horizons, 0]  # 0 = the peak of the next PEAK_MINUTES minutes

    def predict(self, weights: np.ndarray, forecast: SeasonalForecast,
                capacity_per_replica_rpm: float) -> QuantileForecast:
        """Forecasts for every minute of ``forecast``'s series with fitted ``weights`` (serving: each new
        minute, without refitting)."""
        filled = forecast.last_observed
        values = np.empty((len(self.horizons) + 1, len(self.taus), filled.size))
        for i, h in enumerate(self._targets()):
            x, scale = quantile_features(filled, forecast, capacity_per_replica_rpm, h or 2)
            # Non-crossing: a higher τ never gives a lower quantile (sorted per minute).
            values[i] = np.sort(np.maximum(x @ weights[i].T, 0.0), axis=1).T * scale
        return QuantileForecast(values=values, taus=self.taus, horizons=self.horizons, weights=weights)
