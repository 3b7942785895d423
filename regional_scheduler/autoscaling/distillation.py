"""The autoscaling quantile forecaster distilled from a larger teacher into the small model that is served.

The forecaster is the one :mod:`.federated` trains: for every minute ``t``, quantiles ``τ ∈ TAUS`` of the
next minute's load over the recent mean, from the 22 causal, scale-free features of
:mod:`.quantile_forecaster`. Serving wants it tiny (one decision per minute per service, on the control
plane's CPU), while a larger model may find structure the linear form cannot express (interactions
between bursts, seasonality and counting noise). Distillation keeps the small model served and lets it
learn from the large one's outputs, which are smoother targets than the noisy loads themselves.

Three forecasters per series, all trained on its **training days only** (held-back days are used by
nobody until the comparison):

* **teacher**: an MLP (hidden ReLU layers, 64 × 64 by default, plus a linear skip) over the same features,
  trained on the pinball loss, the checkpoint with the lowest loss on the last tenth of the training rows
  kept;
* **student**: the served form, at most a tenth of the teacher's parameters: a tiny MLP (one hidden
  layer of 16 plus the linear skip, by default) or the linear ``22 × len(TAUS)`` model alone, trained to
  match the teacher's quantiles on the training rows (squared distance), mixed with the true pinball
  loss (``alpha``: the teacher's share). Part of the true loss stays in because a squared distance
  weighs the rows where the teacher's quantiles are extreme most, and a student too small to copy the
  teacher everywhere should still spend its capacity where the true quantiles are;
* **student_direct**: the same architecture from the same start, with the same optimiser and steps, on
  the pinball loss alone: what distillation has to beat.

Both qualities are reported: the held-back mean pinball loss, and the SLO-violation minutes and
replica-minutes when each forecaster drives :class:`~.policies.quantile_policy.QuantilePolicy` over the
held-back days in the project's simulator (:meth:`~.scenario.Scenario.held_back`), with the quantile
levels either fixed or budget-matched on the last training week as the autoscaling benchmark does
(:mod:`.calibration`). Both sizes are reported: parameters, bytes of the serialised weights (``.npz``),
and the p99 of one decision (one minute's features → quantiles), teacher and students timed interleaved
in one run so machine load hits all of them alike.
"""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from regional_scheduler.autoscaling.calibration import (
    CALIBRATION_DAYS,
    QUANTILE_BUDGET_RATIO,
    TAU_DOWN_BELOW_UP_MAX,
    QuantileCalibration,
    _best_within_budget,
)
from regional_scheduler.autoscaling.federated import HORIZON, TAUS, SeriesRows, initial_weights, series_rows
from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
from regional_scheduler.autoscaling.policies.quantile_policy import QuantilePolicy
from regional_scheduler.autoscaling.quantile_forecaster import (
    FEATURES,
    QuantileForecast,
)
from regional_scheduler.autoscaling.scenario import Scenario, build_scenario

#: Quantile levels the policy uses when not budget-matched: scale up for the 0.97-quantile of the next
#: minute, keep the 0.9-quantile on the way down (the benchmark's typical pair on these series).
DEFAULT_TAU_UP = 0.97
DEFAULT_TAU_DOWN = 0.9
VALIDATION_FRACTION = 0.1


class Forecaster(Protocol):
    """A served quantile forecaster: numpy weights, one call per decision."""

    def predict(self, x: np.ndarray) -> np.ndarray: ...

    def arrays(self) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class LinearForecaster:
    """The served form: ``x @ w`` with ``w`` of shape ``(len(FEATURES), len(TAUS))``."""

    w: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        return x @ self.w

    def arrays(self) -> dict[str, np.ndarray]:
        return {"w": self.w}


@dataclass(frozen=True)
class MlpForecaster:
    """The teacher: standardised features → ReLU layers → quantiles, plus a linear skip from the raw
    features (so it contains the linear model and only has to learn what that misses)."""

    mean: np.ndarray
    std: np.ndarray
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    skip: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        h = (x - self.mean) / self.std
        for w, b in self.layers[:-1]:
            h = np.maximum(h @ w + b, 0.0)
        w, b = self.layers[-1]
        return h @ w + b + x @ self.skip

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"mean": self.mean, "std": self.std, "skip": self.skip}
        for i, (w, b) in enumerate(self.layers):
            out[f"w{i}"], out[f"b{i}"] = w, b
        return out


def parameter_count(model: Forecaster) -> int:
    """Every stored number (weights, biases, and the teacher's input standardisation)."""
    return int(sum(a.size for a in model.arrays().values()))


def serialised_bytes(model: Forecaster) -> int:
    """Size of the weights as they would be shipped: an uncompressed ``.npz`` of float64 arrays."""
    buffer = io.BytesIO()
    np.savez(buffer, **model.arrays())
    return buffer.getbuffer().nbytes


def _pinball(q: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    tau = torch.as_tensor(TAUS, dtype=q.dtype)[None, :]
    r = y[:, None] - q
    return torch.maximum(tau * r, (tau - 1.0) * r).mean()


def pinball_loss(model: Forecaster, x: np.ndarray, y: np.ndarray) -> float:
    """Mean pinball loss over :data:`TAUS` of ``model`` on rows ``(x, y)`` (lower is better)."""
    with torch.no_grad():
        return float(_pinball(torch.as_tensor(model.predict(x)), torch.as_tensor(y)))


class _Mlp(torch.nn.Module):
    def __init__(self, mean: np.ndarray, std: np.ndarray, hidden: Sequence[int]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean))
        self.register_buffer("std", torch.as_tensor(std))
        sizes = [len(FEATURES), *hidden, len(TAUS)]
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b, dtype=torch.float64)
                                          for a, b in itertools.pairwise(sizes))
        self.skip = torch.nn.Parameter(torch.as_tensor(initial_weights()))
        with torch.no_grad():  # start as the untrained linear model: the MLP part adds nothing yet
            self.layers[-1].weight.zero_()
            self.layers[-1].bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x - self.mean) / self.std
        for layer in self.layers[:-1]:
            h = torch.relu(layer(h))
        return self.layers[-1](h) + x @ self.skip

    def export(self) -> MlpForecaster:
        layers = tuple((layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy())
                       for layer in self.layers)
        return MlpForecaster(self.mean.numpy().copy(), self.std.numpy().copy(), layers,
                             self.skip.detach().numpy().copy())


def _standardisation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and deviations of training rows (the bias column left as it is)."""
    mean, std = x.mean(axis=0), x.std(axis=0)
    constant = std < 1e-6
    mean[constant], std[constant] = 0.0, 1.0
    return mean, std


def _mixed_loss(q: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, alpha: float) -> torch.Tensor:
    """The pinball loss on ``y``; with a teacher's quantiles ``target``, mixed with the squared distance to them:
    ``alpha × distance + (1 − alpha) × pinball``."""
    loss = _pinball(q, y)
    if target is None:
        return loss
    return alpha * ((q - target) ** 2).mean() + (1.0 - alpha) * loss


def train_mlp(x: np.ndarray, y: np.ndarray, *, hidden: Sequence[int] = (64, 64), steps: int = 3000,
              batch: int = 2048, lr: float = 3e-3, weight_decay: float = 0.0, seed: int = 0,
              teacher: Forecaster | None = None, alpha: float = 0.5) -> MlpForecaster:
    """An MLP forecaster from the untrained start (the linear skip at :func:`.federated.initial_weights`, the
    MLP's output zero): minibatch AdamW (cosine schedule) on the first 90 % of the training rows, keeping the
    weights with the lowest loss on the last 10 % (checked every 50 steps), so capacity is bounded by what
    generalises inside the training days. The loss is :func:`_mixed_loss` (the pinball loss alone without
    ``teacher``); the teacher's quantiles are computed on the same training rows."""
    torch.manual_seed(seed)
    split = int(len(y) * (1.0 - VALIDATION_FRACTION))
    mean, std = _standardisation(x[:split])
    net = _Mlp(mean, std, hidden)
    target = torch.as_tensor(teacher.predict(x)) if teacher is not None else None
    xf, yf = torch.as_tensor(x[:split]), torch.as_tensor(y[:split])
    xv, yv = torch.as_tensor(x[split:]), torch.as_tensor(y[split:])
    tf, tv = (target[:split], target[split:]) if target is not None else (None, None)
    optimiser = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, max(steps, 1))
    generator = torch.Generator().manual_seed(seed)
    best = (float("inf"), net.export())
    for step in range(steps):
        idx = torch.randint(0, split, (min(batch, split),), generator=generator)
        optimiser.zero_grad()
        loss = _mixed_loss(net(xf[idx]), yf[idx], None if tf is None else tf[idx], alpha)
        loss.backward()
        optimiser.step()
        schedule.step()
        if (step + 1) % 50 == 0 or step + 1 == steps:
            with torch.no_grad():
                validation = float(_mixed_loss(net(xv), yv, tv, alpha)) if len(yv) else float(loss)
            if validation < best[0]:
                best = (validation, net.export())
    return best[1] if steps else net.export()


def train_teacher(x: np.ndarray, y: np.ndarray, *, hidden: Sequence[int] = (64, 64), steps: int = 3000,
                  lr: float = 3e-3, weight_decay: float = 0.0, seed: int = 0) -> MlpForecaster:
    """The teacher: an MLP on the pinball loss (:func:`train_mlp`)."""
    return train_mlp(x, y, hidden=hidden, steps=steps, lr=lr, weight_decay=weight_decay, seed=seed)


def train_linear(x: np.ndarray, y: np.ndarray, *, teacher: Forecaster | None = None, alpha: float = 0.5,
                 steps: int = 1500, lr: float = 0.01, seed: int = 0) -> LinearForecaster:
    """The linear model from the untrained start (:func:`.federated.initial_weights`): full-batch Adam,
    in standardised feature coordinates (the pinball loss is flat along badly scaled directions), on

        alpha × mean squared distance to the teacher's quantiles + (1 − alpha) × pinball loss on ``y``

    (``teacher=None``: the pinball loss alone, the directly trained student). The teacher's quantiles are
    computed on the same training rows; nothing else enters."""
    torch.manual_seed(seed)
    mean, std = _standardisation(x)
    bias = FEATURES.index("bias")
    z = torch.as_tensor((x - mean) / std)
    z[:, bias] = 1.0
    yt = torch.as_tensor(y)
    # Raw weights w ↔ standardised v: x @ w = z @ v with v = w × std (per row), v_bias = Σ mean × w.
    w0 = initial_weights()
    v0 = w0 * std[:, None]
    v0[bias] = w0[bias] + (mean[:, None] * w0).sum(axis=0)  # the bias column's own mean is 0
    v = torch.as_tensor(v0).clone().requires_grad_(True)
    target = torch.as_tensor(teacher.predict(x)) if teacher is not None else None
    optimiser = torch.optim.Adam([v], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, max(steps, 1))
    for _ in range(steps):
        optimiser.zero_grad()
        loss = _mixed_loss(z @ v, yt, target, alpha)
        loss.backward()
        optimiser.step()
        schedule.step()
    fitted = v.detach().numpy()
    w = fitted / std[:, None]
    w[bias] = fitted[bias] - np.delete(mean[:, None] * w, bias, axis=0).sum(axis=0)
    return LinearForecaster(w)


def train_student(x: np.ndarray, y: np.ndarray, *, hidden: Sequence[int] = (), teacher: Forecaster | None = None,
                  alpha: float = 0.5, steps: int = 1500, seed: int = 0) -> Forecaster:
    """The served model: linear (``hidden`` empty, :func:`train_linear`) or a tiny MLP (:func:`train_mlp`),
    distilled from ``teacher`` or, without one, trained on the pinball loss alone."""
    if not hidden:
        return train_linear(x, y, teacher=teacher, alpha=alpha, steps=steps, seed=seed)
    return train_mlp(x, y, hidden=hidden, steps=steps, seed=seed, teacher=teacher, alpha=alpha)


def teacher_distance(student: Forecaster, teacher: Forecaster, x: np.ndarray) -> float:
    """Mean absolute difference between the student's and the teacher's quantiles on rows ``x``."""
    return float(np.mean(np.abs(student.predict(x) - teacher.predict(x))))


def quantile_forecast(model: Forecaster, rows: SeriesRows) -> QuantileForecast:
    """``model``'s forecasts for every minute, as :class:`QuantilePolicy` reads them (load in replicas,
    non-crossing). Only the next minute is forecast, so every horizon the policy asks for gets it."""
    q = np.sort(np.maximum(model.predict(rows.x), 0.0), axis=1).T * rows.scale[None, :]
    return QuantileForecast(values=np.stack([q, q]), taus=TAUS, horizons=(HORIZON,),
                            weights=np.zeros((2, len(TAUS), 0)))


def _policy(forecast: QuantileForecast, tau_up: float, tau_down: float) -> QuantilePolicy:
    return QuantilePolicy(tau_up, forecast, tau_down=tau_down, peak_down=False)


def calibrate_levels(scenario: Scenario, forecast: QuantileForecast, *, days: int = CALIBRATION_DAYS,
                     budget_ratio: float = QUANTILE_BUDGET_RATIO) -> QuantileCalibration:
    """The benchmark's budget matching (:func:`.calibration.calibrate_quantile_levels`) over the pairs
    :data:`TAUS` allows, on the last ``days`` training days: the fewest SLO-violation minutes within
    ``budget_ratio`` × the HPA's replica-hours there (ties: more head-room)."""
    hpa = scenario.training(HpaPolicy(), last_days=days)
    runs = []
    for up in TAUS[1:]:
        for down in TAUS:
            if up - TAU_DOWN_BELOW_UP_MAX - 1e-9 <= down <= up + 1e-9:
                summary = scenario.training(_policy(forecast, up, down), last_days=days)
                runs.append(QuantileCalibration(up, down, hpa["replica_hours"], summary["replica_hours"],
                                                int(summary["slo_violation_minutes"])))
    return _best_within_budget(runs, budget_ratio * hpa["replica_hours"], spend_on_ties=True)


def decision_p99_ms(models: dict[str, Forecaster], x: np.ndarray, *, decisions: int = 2000,
                    seed: int = 0) -> dict[str, float]:
    """p99 time of one decision (one minute's features → quantiles) per model, in milliseconds. Models
    are timed interleaved, in a rotating order, on the same rows, so they share the machine's state."""
    rng = np.random.default_rng(seed)
    rows = x[rng.integers(0, len(x), decisions)]
    names = list(models)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up: first calls allocate
        models[name].predict(rows[:1])
    for i in range(decisions):
        row = rows[i : i + 1]
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            t0 = time.perf_counter_ns()
            models[name].predict(row)
            times[name].append(time.perf_counter_ns() - t0)
    return {n: float(np.percentile(times[n], 99)) / 1e6 for n in names}


@dataclass(frozen=True)
class DistillationConfig:
    """Sizes and optimisation of one run (the benchmark's defaults)."""

    hidden: tuple[int, ...] = (64, 64)
    student_hidden: tuple[int, ...] = (16,)
    teacher_steps: int = 3000
    teacher_lr: float = 3e-3
    weight_decay: float = 0.0
    student_steps: int = 3000
    alpha: float = 0.5
    seed: int = 0
    calibrate: bool = True
    tau_up: float = DEFAULT_TAU_UP
    tau_down: float = DEFAULT_TAU_DOWN
    decisions: int = 2000


@dataclass
class Fitted:
    """One series' three forecasters, as trained on its training rows."""

    teacher: MlpForecaster
    student: Forecaster
    student_direct: Forecaster


def fit_all(rows: SeriesRows, config: DistillationConfig) -> Fitted:
    """Teacher, distilled student and direct student of one series, from its training rows only."""
    x, y = rows.x_train, rows.y_train
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small dense layers: threads only add contention (and change float sums)
    try:
        teacher = train_teacher(x, y, hidden=config.hidden, steps=config.teacher_steps, lr=config.teacher_lr,
                                weight_decay=config.weight_decay, seed=config.seed)
        student = train_student(x, y, hidden=config.student_hidden, teacher=teacher, alpha=config.alpha,
                                steps=config.student_steps, seed=config.seed)
        direct = train_student(x, y, hidden=config.student_hidden, steps=config.student_steps, seed=config.seed)
    finally:
        torch.set_num_threads(threads)
    return Fitted(teacher, student, direct)


MODELS: tuple[str, ...] = ("teacher", "student", "student_direct")


@dataclass
class SeriesResult:
    name: str
    fitted: Fitted
    metrics: dict[str, dict[str, float]]
    extra: dict[str, Any] = field(default_factory=dict)


def evaluate_series(scenario: Scenario, rows: SeriesRows, fitted: Fitted, config: DistillationConfig,
                    advance: Callable[[str], None] | None = None) -> SeriesResult:
    """Both sizes and both qualities of the three forecasters on one series' held-back days."""
    models: dict[str, Forecaster] = {n: getattr(fitted, n) for n in MODELS}
    p99 = decision_p99_ms(models, rows.x_test, decisions=config.decisions, seed=config.seed)
    metrics: dict[str, dict[str, float]] = {}
    levels: dict[str, dict[str, float]] = {}
    for name, model in models.items():
        forecast = quantile_forecast(model, rows)
        if config.calibrate:
            c = calibrate_levels(scenario, forecast)
            up, down = c.tau_up, c.tau_down
        else:
            up, down = config.tau_up, config.tau_down
        summary = scenario.held_back(_policy(forecast, up, down))
        levels[name] = {"tau_up": up, "tau_down": down}
        metrics[name] = {
            "params": parameter_count(model), "bytes": serialised_bytes(model), "p99_ms": p99[name],
            "pinball": pinball_loss(model, rows.x_test, rows.y_test),
            "train_pinball": pinball_loss(model, rows.x_train, rows.y_train),
            "violation_minutes": int(summary["slo_violation_minutes"]),
            "replica_minutes": float(summary["replica_hours"] * 60.0),
        }
        if advance is not None:
            advance(f"{rows.name}: {name}")
    untrained = LinearForecaster(initial_weights())
    extra = {"levels": levels, "train_rows": int(rows.train.sum()), "test_rows": int(rows.test.sum()),
             "teacher_distance_test": {n: teacher_distance(m, fitted.teacher, rows.x_test)
                                       for n, m in (("student", fitted.student),
                                                    ("student_direct", fitted.student_direct),
                                                    ("untrained", untrained))}}
    return SeriesResult(rows.name, fitted, metrics, extra)


def _gap(student: float, teacher: float) -> float:
    """Relative excess of the student over the teacher (0 when both are 0)."""
    if teacher > 0:
        return student / teacher - 1.0
    return 0.0 if student == 0 else float("inf")


def summarise(results: Sequence[SeriesResult], config: DistillationConfig) -> dict[str, Any]:
    """The JSON the benchmark writes: per series and totals for each model, the parameter ratio and the
    violation-minutes gap (student vs teacher, in %)."""
    totals: dict[str, dict[str, float]] = {}
    for name in MODELS:
        per = [r.metrics[name] for r in results]
        totals[name] = {
            "params": per[0]["params"], "bytes": per[0]["bytes"],
            "p99_ms": float(np.max([m["p99_ms"] for m in per])),
            "pinball": float(np.mean([m["pinball"] for m in per])),
            "violation_minutes": int(sum(m["violation_minutes"] for m in per)),
            "replica_minutes": float(sum(m["replica_minutes"] for m in per)),
        }
    teacher, student, direct = (totals[n] for n in MODELS)
    return {
        **totals,
        "ratio": {
            "params": student["params"] / teacher["params"],
            "bytes": student["bytes"] / teacher["bytes"],
            "violation_minutes_gap_pct": 100.0 * _gap(student["violation_minutes"], teacher["violation_minutes"]),
            "direct_violation_minutes_gap_pct": 100.0 * _gap(direct["violation_minutes"],
                                                             teacher["violation_minutes"]),
            "replica_minutes_gap_pct": 100.0 * _gap(student["replica_minutes"], teacher["replica_minutes"]),
            "pinball_gap_pct": 100.0 * _gap(student["pinball"], teacher["pinball"]),
        },
        "series": {r.name: {**r.metrics, **r.extra} for r in results},
        "config": {"hidden": list(config.hidden), "student_hidden": list(config.student_hidden),
                   "teacher_steps": config.teacher_steps,
                   "student_steps": config.student_steps, "alpha": config.alpha, "seed": config.seed,
                   "levels": "budget-matched on the last training week" if config.calibrate
                   else {"tau_up": config.tau_up, "tau_down": config.tau_down},
                   "p99_ms": "per decision (one minute's features → quantiles); totals: the worst series"},
    }


def run(paths: dict[str, Path], config: DistillationConfig,
        advance: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[SeriesResult]]:
    """Train and compare the three forecasters on each named series; the benchmark's JSON and the
    per-series results (with their weights)."""
    results = []
    for name, path in paths.items():
        scenario = build_scenario(path)
        rows = series_rows(scenario, name)
        fitted = fit_all(rows, config)
        if advance is not None:
            advance(f"{name}: trained")
        results.append(evaluate_series(scenario, rows, fitted, config, advance))
    return summarise(results, config), results


def save_weights(path: Path, results: Sequence[SeriesResult]) -> None:
    """Every series' teacher and students in one ``.npz`` (``<series>/<model>/<array>`` keys)."""
    arrays = {f"{r.name}/{m}/{k}": v for r in results for m in MODELS
              for k, v in getattr(r.fitted, m).arrays().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
