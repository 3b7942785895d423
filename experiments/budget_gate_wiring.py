"""What the replica-hours budget gate does to ``quantile-budget`` on the shared series (the prototype wiring).

Question: does :class:`~regional_scheduler.autoscaling.budget_gate.ReplicaHoursBudgetGate`, pulling the
quantile levels down while the policy is in debt, hold the budget on every series, and at what cost in
SLO-violation minutes? (docs/drift-and-gates.md, "Real series, prototype wiring".)

The gate is wired here from outside: a :class:`QuantilePolicy` subclass records, each observed minute,
the policy's mean replicas (counted as :class:`~regional_scheduler.autoscaling.replica_budget.ReplicaBudget`
counts them) and the shadow HPA's (by wrapping its ``advance``), and lowers both quantiles by the gate's
``levels_down``. The gate is now wired into the product (``ReplicaBudget.gate``), so this is superseded
by ``meridian bench autoscale``: the ``quantile-budget`` row printed here now includes the gate too
(the ungated figures of docs/drift-and-gates.md were measured before the wiring), and "levels" measures
the same policy again; "cap" is still only here. Run::

    OMP_NUM_THREADS=1 python -m experiments.budget_gate_wiring SERIES.csv validation levels,cap
    OMP_NUM_THREADS=1 python -m experiments.budget_gate_wiring SERIES.csv held_back levels

Each fit takes a few minutes (the benchmark's own fitting and calibration).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from regional_scheduler.autoscaling.benchmark import VALIDATION_DAYS
from regional_scheduler.autoscaling.budget_gate import (
    BudgetGateSettings,
    ReplicaHoursBudgetGate,
    shifted_tau_signed,
)
from regional_scheduler.autoscaling.calibration import fit_quantile_policy
from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy, PolicyContext
from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
from regional_scheduler.autoscaling.policies.quantile_policy import QuantilePolicy
from regional_scheduler.autoscaling.scenario import build_scenario
from regional_scheduler.autoscaling.settings import BudgetSettings
from regional_scheduler.autoscaling.simulator import Observation


class GatedQuantilePolicy(QuantilePolicy):
    """``quantile-budget`` with the gate: ``mode`` "levels" (down the grid) or "cap" (``limit()``)."""

    def __init__(self, *args: Any, mode: str = "levels", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mode = mode
        self.gate = ReplicaHoursBudgetGate()
        self._shadow_minutes: list[float] = []
        self._own_sum, self._own_count = 0.0, 0

    def reset(self, context: PolicyContext) -> None:
        super().reset(context)
        assert self.budget is not None, "a budget policy"
        self.gate = ReplicaHoursBudgetGate(BudgetGateSettings(ratio=self.budget.settings.ratio))
        self._shadow_minutes.clear()
        self._own_sum, self._own_count = 0.0, 0

    def _record(self, observation: Observation) -> int:
        """The bank's levels; records each newly observed minute (own, shadow) in the gate."""
        assert self.budget is not None
        own = self._own_sum / self._own_count if self._own_count else float(observation.current_replicas)
        levels = self.budget.observe(observation)
        shadow = self.budget.shadow
        if shadow is not None and not getattr(shadow, "gate_wrapped", False):
            advance: Callable[[float], float] = shadow.advance

            def recorded(load: float) -> float:
                replicas = advance(load)
                self._shadow_minutes.append(replicas)
                return replicas

            shadow.advance = recorded  # type: ignore[method-assign]
            shadow.gate_wrapped = True  # type: ignore[attr-defined]
        if self._shadow_minutes:
            for replicas in self._shadow_minutes:
                self.gate.record(own, replicas)
            self._shadow_minutes.clear()
            self._own_sum, self._own_count = 0.0, 0
        self._own_sum += observation.current_replicas
        self._own_count += 1
        return levels

    def decide(self, observation: Observation) -> int:
        self.levels = self._record(observation)
        if self.mode == "cap":
            load = observation.load_replicas
            floor = math.ceil(load / self.utilisation) if math.isfinite(load) else 0
            return self.guard(self.gate.limit(self.propose(observation), floor).replicas, observation)
        signed = self.levels - self.gate.levels_down
        taus = self.model.taus if self.model is not None else (self.tau,)
        saved = self.tau, self.tau_down
        self.tau, self.tau_down = (shifted_tau_signed(taus, t, signed) for t in saved)
        self.levels = 0
        try:
            return self.guard(self.propose(observation), observation)
        finally:
            self.tau, self.tau_down = saved


def main(path: Path, split: str, modes: list[str]) -> None:
    scenario = build_scenario(path)
    end = scenario.split.train_end_minute
    if split == "validation":
        end = max(end - VALIDATION_DAYS * 1440, min(end, 2 * 1440))
    fitted = fit_quantile_policy(scenario, end_minute=end)

    def run(policy: AutoscalingPolicy) -> dict[str, float]:
        if split == "validation":
            result, first = scenario.run(policy, end, scenario.split.train_end_minute)
            return result.summary(first)
        return scenario.held_back(policy)

    hpa = run(HpaPolicy())
    policies: dict[str, AutoscalingPolicy] = {"quantile-budget": fitted.policy(budget=BudgetSettings())}
    for mode in modes:
        policies[f"gated-{mode}"] = GatedQuantilePolicy(
            fitted.calibration.tau_up, fitted.model, tau_down=fitted.calibration.tau_down,
            budget=BudgetSettings(), mode=mode)
    print(f"{path.stem} {split}: hpa {hpa['slo_violation_minutes']} violation minutes")
    for name, policy in policies.items():
        summary = run(policy)
        print(f"{path.stem} {split}: {name} {summary['slo_violation_minutes']} violation minutes at "
              f"{summary['replica_hours'] / hpa['replica_hours']:.3f} × the HPA's replica-hours")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(",") if len(sys.argv) > 3 else ["levels"])
