"""Quantile policy: provision each minute for the τ-quantile of the load it will have to serve.

Timing decides what each direction must cover (15 s ticks, metrics one scrape late, pods ready 60 s
after a scale-up, removals immediate):

* **scale-up** — pods asked for now first serve the minute after next (or the next one when the
  current minute is already observed), so the target is ``ceil(Q_τ(load[t + lag + 1]) / u)`` with ``t``
  the last observed minute and ``lag`` the minutes since;
* **scale-down** — removals act at once, and pods re-added now would miss the current and the next
  minute, so what is kept must cover both: ``ceil(max(Q_τ(load[t + lag]), Q_τ(load[t + lag + 1])) / u)``
  (the current minute's load itself once it is observed).

``u`` is the highest utilisation meeting the latency SLO (queueing model) less ``margin``. The guard
rails then apply as for every policy. ``τ`` is the only knob and is chosen on training days by budget
matching (:mod:`..calibration`); the quantile models are fitted on training days only
(:mod:`..quantile_forecaster`).

Compared with ``forecast`` (peak of the last 10 minutes + z × noise), this policy removes pods as soon
as the *predicted* load allows (the HPA keeps them for its 300 s stabilisation window; ``forecast``
for 10 minutes), and spends the saved replica-hours where the learned quantiles say the risk is:
recurring bursts, rising hours, few-requests-per-minute noise.
"""

from __future__ import annotations

import math

from regional_scheduler.autoscaling.budget_gate import shifted_tau_signed
from regional_scheduler.autoscaling.policies.base import GuardedPolicy, PolicyContext
from regional_scheduler.autoscaling.quantile_forecaster import (
    QuantileForecast,
    QuantileForecaster,
    poisson_forecast,
)
from regional_scheduler.autoscaling.queueing import max_utilisation_within_slo
from regional_scheduler.autoscaling.replica_budget import ReplicaBudget
from regional_scheduler.autoscaling.settings import AutoscalerSettings, BudgetSettings
from regional_scheduler.autoscaling.simulator import Observation

NAME = "quantile"
BUDGET_NAME = "quantile-budget"
DEFAULT_TAU = 0.95
DEFAULT_TAU_DOWN = 0.85
UTILISATION_MARGIN = 0.98
#: Serving without a benchmark-fitted model: the linear model needs this much history (else the count
#: model, which has nothing to fit) and is refitted once a day as history grows.
MIN_FIT_MINUTES = 2 * 1440
REFIT_EVERY_MINUTES = 1440


def shifted_tau(grid: tuple[float, ...], tau: float, levels: int) -> float:
    """``tau`` moved ``levels`` steps along the forecaster's quantile ``grid``: up for the bank's savings,
    down for the budget gate's debt (clamped to the grid's ends)."""
    return shifted_tau_signed(grid, tau, levels)


class QuantilePolicy(GuardedPolicy):
    name = NAME

    def __init__(self, tau: float = DEFAULT_TAU, model: QuantileForecast | None = None, *,
                 margin: float = UTILISATION_MARGIN, tau_down: float | None = None, peak_down: bool = True,
                 budget: BudgetSettings | None = None) -> None:
        super().__init__()
        self.budget = ReplicaBudget(budget) if budget is not None else None
        self.name = BUDGET_NAME if budget is not None else NAME
        self.levels = 0
        self.tau = tau
        self.tau_down = DEFAULT_TAU_DOWN if tau_down is None else tau_down
        self.peak_down = peak_down
        self.model = model
        self._own_model = model is None
        self._fitted_minutes = 0
        self.margin = margin
        self.context: PolicyContext | None = None
        self.utilisation = 0.0

    def reset(self, context: PolicyContext) -> None:
        self.context = context
        svc = context.service
        self.utilisation = self.margin * max_utilisation_within_slo(
            workers=svc.workers_per_replica, service_time_s=svc.service_time_ms / 1000.0,
            slo_s=svc.slo_p99_ms / 1000.0)
        if self._own_model:
            self._fit_own(context)
        if self.budget is not None:
            self.budget.reset(context)
        self.levels = 0
        self.reset_rails(context)

    def _fit_own(self, context: PolicyContext) -> None:
        """Serving (no model given): fit on the history the context holds — all of it is the past there.
        Never used by the benchmark, which passes a model fitted on training days only."""
        history = context.forecast.last_observed
        cap = context.sizing.capacity_per_replica_rpm
        if history.size >= MIN_FIT_MINUTES:
            self.model = QuantileForecaster().fit_transform(history, context.forecast, cap, fit_end=history.size)
        else:
            self.model = poisson_forecast(history, cap)
        self._fitted_minutes = history.size

    def update_context(self, context: PolicyContext) -> None:
        """Serving: a fresh context (one more minute of history) each minute. An own model is refitted
        once a day of new history and otherwise only re-predicted with its weights (cheap)."""
        super().update_context(context)
        if self.budget is not None:
            self.budget.update_context(context)
        if not self._own_model:
            return
        size = context.forecast.last_observed.size
        if size - self._fitted_minutes >= REFIT_EVERY_MINUTES or self._fitted_minutes < MIN_FIT_MINUTES <= size:
            self._fit_own(context)
        elif self.model is not None and self.model.weights.shape[2] > 0:
            self.model = QuantileForecaster().predict(self.model.weights, context.forecast,
                                                      context.sizing.capacity_per_replica_rpm)
        else:
            self.model = poisson_forecast(context.forecast.last_observed, context.sizing.capacity_per_replica_rpm)
        self.context = context

    def propose(self, observation: Observation) -> int:
        assert self.context is not None and self.model is not None, "reset() first"
        current = observation.current_replicas
        last = observation.observed_minutes - 1
        if last < 0:
            return current
        lag = max(0, observation.minute - last)
        model = self.model
        # The budget's banked savings raise both quantiles and its debt lowers them (0 levels without a budget).
        tau, tau_down = (shifted_tau(model.taus, t, self.levels) for t in (self.tau, self.tau_down))
        up_load = model.quantile(last, lag + 1, tau)
        now_load = observation.load_replicas if lag == 0 else model.quantile(last, lag, tau)
        up = math.ceil(up_load / self.utilisation)
        if up > current:
            return up
        keep = model.peak_quantile(last, tau_down) if self.peak_down else model.quantile(last, lag + 1, tau_down)
        down = math.ceil(max(now_load, keep) / self.utilisation)
        return down if down < current else current

    def decide(self, observation: Observation) -> int:
        if self.budget is not None:
            # Net levels: the bank's steps up less the budget gate's steps down (ReplicaBudget.gate).
            self.levels = self.budget.observe(observation) - self.budget.gate.levels_down
        return self.guard(self.propose(observation), observation)


def build(tau: float = DEFAULT_TAU, model: QuantileForecast | None = None) -> QuantilePolicy:
    """Unfitted (serving): the model is fitted on the serving history; the benchmark fits and calibrates
    it on training days instead (:func:`..calibration.fit_quantile_policy`)."""
    return QuantilePolicy(tau, model)


def build_budget(tau: float = DEFAULT_TAU, model: QuantileForecast | None = None,
                 budget: BudgetSettings | None = None) -> QuantilePolicy:
    """The quantile policy under an online replica-hours budget (:mod:`..replica_budget`); without
    ``budget``, the one configured in the environment (``MERIDIAN_AUTOSCALER_BUDGET__*``)."""
    return QuantilePolicy(tau, model, budget=budget or AutoscalerSettings().budget)
