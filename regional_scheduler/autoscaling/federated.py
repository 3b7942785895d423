"""The autoscaling forecaster trained across regions with Flower, each region on its own request series.

The model is the short-horizon quantile forecaster's linear form (:mod:`.quantile_forecaster`): for every
minute ``t``, ``Q_τ(load[t+1]) / s_t = x_t · w_τ`` over the 22 scale-free, causal features, for each τ in
:data:`TAUS`. The features are scale-free (divided by the series' recent mean), so one set of weights can
serve series of very different sizes: what one region learns about bursts, seasonality and noise can help
another, which is what federated training is for. A region is one request series of the shared traces
(LoRA inference, NASA web, Twitter events, Wikipedia pages). Its **training days** train, and its
held-back days (:func:`~.request_series.split_days`) are used by nobody until the comparison.

Three models are compared on every region's held-back days, by the mean pinball loss over :data:`TAUS`
(lower is better):

* **local**: trained on the region's own training days only;
* **federated**: FedAvg or FedProx over all regions (:func:`meridian.federated.engine.run_federated`), where
  only weights and the training loss leave a region;
* **central**: trained on every region's training days pooled: what a company could do if it were
  allowed to move the data, the upper bound federated training approaches;
* **federated, fine-tuned**: the federated model trained a few more steps on the region's own training days
  (``finetune_steps``), in the region: the usual way to serve one shared model to different regions.

All three take the same number of optimiser steps per region's data (``rounds × steps_per_round``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from meridian.federated.comparison import Comparison
from meridian.federated.engine import FederatedResult, RoundStats
from meridian.federated.federate import federate
from meridian.federated.privacy import PrivacySettings
from regional_scheduler.autoscaling.quantile_forecaster import FEATURE_CLIP, FEATURES, quantile_features

if TYPE_CHECKING:
    from regional_scheduler.autoscaling.scenario import Scenario

TAUS: tuple[float, ...] = (0.5, 0.9, 0.97)
HORIZON = 1
#: Region names of the shared request series (file name prefix → region).
SERIES_REGIONS: dict[str, str] = {"lora": "lora", "nasa": "nasa", "twitter": "twitter", "wikipedia": "wikipedia"}


@dataclass(frozen=True)
class RegionData:
    """One region's features and targets: training rows (split into fit and validation) and held-back rows."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def recent(self, days: float) -> RegionData:
        """The region with only the last ``days`` of its training rows: a new region, or one that keeps a
        short history. Its held-back rows are unchanged."""
        keep = max(1, round(days * 1440))
        return RegionData(self.name, self.x_train[-keep:], self.y_train[-keep:], self.x_test, self.y_test)


def region_data(path: Path, name: str | None = None) -> RegionData:
    """Rows of one request series: targets inside its training days train, the held-back days test."""
    from regional_scheduler.autoscaling.request_series import load_request_series

    return series_region_data(load_request_series(path), name)


def split_regions(paths: Sequence[Path], count: int, *, seed: int = 0) -> list[RegionData]:
    """``count`` regions from the request series at ``paths`` (sorted by the caller).

    Up to one region per series, the first ``count`` series each make a region. Beyond that, every series
    is shared among ``ceil(count / len(paths))`` regions by :func:`~.request_series.split_requests` (each
    request in exactly one region), and the first ``count`` of those regions are kept, part by part:
    8 regions from 4 series are two regions per service, each with about half its requests."""
    from regional_scheduler.autoscaling.request_series import load_request_series, split_requests

    if count < 2:
        raise ValueError(f"at least 2 regions, got {count}")
    if count <= len(paths):
        return [region_data(p, p.name.split("_")[0]) for p in paths[:count]]
    parts = -(-count // len(paths))
    regions: list[RegionData] = []
    for p in paths:
        series = load_request_series(p)
        series = type(series)(p.name.split("_")[0], series.start, series.requests_per_minute, series.source_step_s)
        regions += [series_region_data(s) for s in split_requests(series, parts, seed=seed)]
    by_part = sorted(regions, key=lambda r: (int(r.name.rsplit("-", 1)[1]), r.name))
    return sorted(by_part[:count], key=lambda r: r.name)


def series_region_data(series: Any, name: str | None = None) -> RegionData:
    """:func:`region_data` of a series in memory (a :class:`~.request_series.RequestSeries`)."""
    from regional_scheduler.autoscaling.scenario import scenario_from_series

    rows = series_rows(scenario_from_series(series), name)
    return RegionData(rows.name, rows.x_train, rows.y_train, rows.x_test, rows.y_test)


@dataclass(frozen=True)
class SeriesRows:
    """Every minute of one series: features ``x``, scale, target ``y`` (next minute over the scale), and
    which rows train (targets inside the training days) and which are held back. The same rows as
    :class:`RegionData` (which keeps only the rows that train or test), kept for every minute because a
    policy driven by the forecaster needs a forecast at each."""

    name: str
    x: np.ndarray
    scale: np.ndarray
    y: np.ndarray
    train: np.ndarray
    test: np.ndarray

    @property
    def x_train(self) -> np.ndarray:
        return self.x[self.train]

    @property
    def y_train(self) -> np.ndarray:
        return self.y[self.train]

    @property
    def x_test(self) -> np.ndarray:
        return self.x[self.test]

    @property
    def y_test(self) -> np.ndarray:
        return self.y[self.test]


def series_rows(scenario: Scenario, name: str | None = None) -> SeriesRows:
    """Features and targets of ``scenario``'s series: targets inside the training days train, the held-back
    days test; minutes whose load or next load is missing, and the first day (no seasonal history), neither."""
    forecast = scenario.context.forecast
    filled = forecast.last_observed
    n = filled.size
    t = np.arange(n)
    x, scale = quantile_features(filled, forecast, scenario.context.sizing.capacity_per_replica_rpm, HORIZON)
    y = np.minimum(filled[np.clip(t + HORIZON, 0, n - 1)] / scale, FEATURE_CLIP)
    observed = np.isfinite(np.asarray(scenario.load, dtype=float))
    ok = observed & observed[np.clip(t + HORIZON, 0, n - 1)] & (t >= 1440) & (t + HORIZON < n)
    end = scenario.split.train_end_minute
    return SeriesRows(name or scenario.name, x, scale, y, ok & (t + HORIZON < end), ok & (t >= end))


def pinball(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Mean pinball loss of the quantiles ``x @ w`` (one column per τ) against ``y``."""
    tau = torch.as_tensor(TAUS, dtype=torch.float64)[None, :]
    r = y[:, None] - x @ w
    return torch.maximum(tau * r, (tau - 1.0) * r).mean()


def initial_weights() -> np.ndarray:
    """The untrained start: every quantile predicts the recent mean (the bias feature's weight 1)."""
    w = np.zeros((len(FEATURES), len(TAUS)))
    w[FEATURES.index("bias"), :] = 1.0
    return w


def train(x: np.ndarray, y: np.ndarray, w0: np.ndarray, *, steps: int, seed: int, proximal_mu: float = 0.0,
          lr: float = 0.01) -> np.ndarray:
    """``steps`` full-batch Adam steps on the pinball loss from ``w0``; FedProx adds ``mu/2 ||w - w0||²``."""
    torch.manual_seed(seed)
    xt, yt = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    anchor = torch.as_tensor(w0, dtype=torch.float64)
    w = anchor.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([w], lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        loss = pinball(xt, yt, w)
        if proximal_mu:
            loss = loss + proximal_mu / 2 * ((w - anchor) ** 2).sum()
        loss.backward()
        optimiser.step()
    return w.detach().numpy().copy()


def held_out_loss(region: RegionData, w: np.ndarray) -> float:
    with torch.no_grad():
        return float(pinball(torch.as_tensor(region.x_test), torch.as_tensor(region.y_test), torch.as_tensor(w)))


class ForecasterTask:
    """One region's Flower task: train on its training days, report the loss on its last training rows."""

    metric_names = frozenset({"train_loss"})

    def __init__(self, region: RegionData, *, steps_per_round: int) -> None:
        self.region = region
        self.steps_per_round = steps_per_round
        split = int(len(region.y_train) * 0.9)
        self._fit = (region.x_train[:split], region.y_train[:split])
        self._validation = (region.x_train[split:], region.y_train[split:])

    def initial_parameters(self) -> list[np.ndarray]:
        return [initial_weights()]

    def fit(self, parameters: list[np.ndarray], *, epochs: int, proximal_mu: float,
            seed: int) -> tuple[list[np.ndarray], int, dict[str, float]]:
        w = train(*self._fit, parameters[0], steps=self.steps_per_round * epochs, seed=seed, proximal_mu=proximal_mu)
        with torch.no_grad():
            loss = float(pinball(torch.as_tensor(self._fit[0]), torch.as_tensor(self._fit[1]), torch.as_tensor(w)))
        return [w], len(self._fit[1]), {"train_loss": loss}

    def evaluate(self, parameters: list[np.ndarray]) -> tuple[float, int, dict[str, float]]:
        x, y = self._validation
        with torch.no_grad():
            loss = float(pinball(torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(parameters[0])))
        return loss, len(y), {}


def compare(regions: Sequence[RegionData], *, rounds: int = 20, steps_per_round: int = 25, strategy: str = "fedavg",
            proximal_mu: float = 0.1, seed: int = 0, finetune_steps: int = 50,
            on_round: Callable[[RoundStats], None] | None = None,
            privacy: PrivacySettings | None = None,
            secure_aggregation: bool = False) -> tuple[Comparison, FederatedResult]:
    """Local, federated and central models on every region's held-back days, in one run (with ``privacy``,
    the federated model is trained under differential privacy and the comparison reports its budget; with
    ``secure_aggregation``, FedAvg's sums are computed by Flower's SecAgg+, so the server never sees one
    region's weights)."""
    steps = rounds * steps_per_round
    start = initial_weights()
    t0 = time.perf_counter()
    local = {r.name: train(r.x_train, r.y_train, start, steps=steps, seed=seed) for r in regions}
    t1 = time.perf_counter()
    central = train(np.concatenate([r.x_train for r in regions]), np.concatenate([r.y_train for r in regions]),
                    start, steps=steps, seed=seed)
    t2 = time.perf_counter()
    tasks = {r.name: ForecasterTask(r, steps_per_round=steps_per_round) for r in regions}
    result = federate(tasks, rounds=rounds, strategy=strategy, proximal_mu=proximal_mu, seed=seed, on_round=on_round,
                      privacy=privacy, secure_aggregation=secure_aggregation,
                      max_examples=max(len(r.y_train) for r in regions))
    t3 = time.perf_counter()
    federated = result.parameters[0]
    per_region: dict[str, dict[str, float]] = {}
    for r in regions:
        tuned = train(r.x_train, r.y_train, federated, steps=finetune_steps, seed=seed)
        per_region[r.name] = {"untrained": held_out_loss(r, start), "local": held_out_loss(r, local[r.name]),
                              "federated": held_out_loss(r, federated), "central": held_out_loss(r, central),
                              "federated_finetuned": held_out_loss(r, tuned),
                              "train_rows": len(r.y_train), "test_rows": len(r.y_test)}
    names = ("untrained", "local", "federated", "central", "federated_finetuned")
    totals = {k: float(np.mean([v[k] for v in per_region.values()])) for k in names}
    totals["federated_beats_local_regions"] = sum(v["federated"] <= v["local"] for v in per_region.values())
    totals["finetuned_beats_local_regions"] = sum(v["federated_finetuned"] <= v["local"] for v in per_region.values())
    totals["federated_vs_central"] = totals["federated"] / totals["central"] - 1.0
    return (Comparison(per_region, totals, result.rounds, {"local": t1 - t0, "central": t2 - t1, "federated": t3 - t2},
                       len(result.refused_updates), result.privacy), result)
