"""An online replica-hours budget: spend what the HPA would have spent, measured as the load arrives.

A budget matched on past days (:mod:`.calibration`) drifts on new ones: the quantile policy calibrated to
1.0 × the HPA on its last training week spent 0.954 × and 0.988 × on the next days of two series, and
1.04 × on another — head-room bought on a calm week is wasted on a busy one and missing on a calm one.
Here the reference is measured instead of predicted:

* :class:`ShadowHpa` replays the exact HPA (:mod:`.hpa`, default ``behavior``) on a model of the service
  (:class:`.simulator.ServiceSimulator`) fed only the load already observed, minute by minute: it is
  what the HPA would be running now had it been in charge from the start.
* :class:`ReplicaBudget` banks, each observed minute, ``ratio`` × the shadow's replicas minus the
  replicas actually running, with a leak of ``memory_days``, and turns a positive balance into extra
  risk levels: ``floor(balance / minutes_per_level)`` steps up the quantile grid (balance in minutes of
  the shadow's mean spend), at most ``max_levels``.

Savings made in quiet hours are thus spent later where the forecast is uncertain (a higher quantile
adds most where the spread is widest). The bank's negative balance never lowers the levels: on the
validation split, cutting below the calibrated ones on the leaky balance (a multiplier down to 0.8, or
levels down) raised violations sharply (LoRA 456 → 587 minutes) because every breach then costs a
guard-rail scale-up, which overspends again. An overspend of the calibrated levels themselves is pulled
back by a separate gate instead, :class:`.budget_gate.ReplicaHoursBudgetGate` (``gate``): fed the same
observed minutes (the policy's replicas and the shadow's), it counts a debt only when the spend over a
sliding week exceeds ``ratio`` × the shadow's, and only after a day, and turns it into steps *down* the
quantile grid (``levels_down``) that the policy subtracts from the bank's steps up. A policy within its
budget is therefore never cut; one that overspends is held to it (docs/drift-and-gates.md). The guard
rails still apply after the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from regional_scheduler.autoscaling.budget_gate import BudgetGateSettings, ReplicaHoursBudgetGate
from regional_scheduler.autoscaling.policies.base import PolicyContext
from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
from regional_scheduler.autoscaling.settings import BudgetSettings
from regional_scheduler.autoscaling.simulator import Observation, ServiceSimulator

MINUTE_S = 60.0
#: The shadow's simulator keeps per-tick records; a serving process restarts it from its current replica
#: count after this many minutes (two weeks: longer than any benchmark run, ~14 MB at most). The HPA's own
#: memory is five minutes, so a restart costs the bank nothing measurable.
SHADOW_RESTART_MINUTES = 14 * 1440


@dataclass
class ShadowHpa:
    """The HPA on a simulated copy of the service, one observed minute at a time (never ahead of them)."""

    simulator: ServiceSimulator
    hpa: HpaPolicy
    context: PolicyContext

    @classmethod
    def start(cls, context: PolicyContext, initial_replicas: int) -> ShadowHpa:
        hpa = HpaPolicy()
        hpa.reset(context)
        return cls(ServiceSimulator.open_ended(context.service, initial_replicas=initial_replicas), hpa, context)

    def advance(self, load_replicas: float) -> float:
        """Serve one more minute of ``load_replicas`` under the HPA; returns its mean replicas that minute."""
        if self.simulator.end_minute >= SHADOW_RESTART_MINUTES:
            restarted = ShadowHpa.start(self.context, self.simulator.replicas)
            self.simulator, self.hpa = restarted.simulator, restarted.hpa
        simulator = self.simulator
        simulator.append_minutes([max(0.0, load_replicas)])
        total = 0
        for _ in range(simulator.ticks_per_minute):
            simulator.step(self.hpa.decide(simulator.observe()))
            total += simulator.replicas
        return total / simulator.ticks_per_minute


@dataclass
class ReplicaBudget:
    """Banks the difference between ``ratio`` × the shadow HPA's spend and the policy's own."""

    settings: BudgetSettings
    shadow: ShadowHpa | None = None
    balance: float = 0.0  # replica-minutes
    shadow_minutes: float = 0.0  # leaky total of the shadow's replica-minutes
    own_minutes: float = 0.0  # the same for the policy
    minutes: float = 0.0  # leaky count of the minutes in those totals
    gate: ReplicaHoursBudgetGate = field(default_factory=ReplicaHoursBudgetGate, repr=False)
    _own_sum: float = 0.0
    _own_count: int = 0
    _last_observed: int = 0
    _last_minute_s: float = 0.0
    _context: PolicyContext | None = field(default=None, repr=False)

    def reset(self, context: PolicyContext) -> None:
        self._context = context
        self.shadow = None
        self.balance = self.shadow_minutes = self.own_minutes = self.minutes = 0.0
        self._own_sum, self._own_count = 0.0, 0
        self.gate = ReplicaHoursBudgetGate(BudgetGateSettings(ratio=self.settings.ratio))

    def update_context(self, context: PolicyContext) -> None:
        """Serving: the shadow HPA follows the service's current bounds, keeping its memory."""
        self._context = context
        if self.shadow is not None:
            self.shadow.context = context
            self.shadow.hpa.update_context(context)

    @property
    def leak(self) -> float:
        return math.exp(-1.0 / (self.settings.memory_days * 1440.0))

    @property
    def mean_shadow(self) -> float:
        """The shadow's mean replicas over the bank's memory (leaky mean)."""
        return self.shadow_minutes / self.minutes if self.minutes > 0 else 0.0

    @property
    def levels(self) -> int:
        """Steps up the quantile grid the balance pays for (0 when nothing is banked)."""
        if self.mean_shadow <= 0 or self.balance <= 0:
            return 0
        banked_minutes = self.balance / self.mean_shadow
        return min(int(banked_minutes // self.settings.minutes_per_level), self.settings.max_levels)

    @property
    def spend_ratio(self) -> float:
        """The policy's spend over the shadow HPA's (leaky totals; 1.0 before anything is known)."""
        return self.own_minutes / self.shadow_minutes if self.shadow_minutes > 0 else 1.0

    def _new_minutes(self, observation: Observation) -> int:
        """Minutes observed since the last call. A benchmark run counts them in ``observed_minutes``; the
        serving loop, whose history index stops growing once history is trimmed, advances by a minute of
        ``time_s`` per sample."""
        new = observation.observed_minutes - self._last_observed
        if new <= 0 and observation.time_s - self._last_minute_s >= MINUTE_S:
            new = 1
        return max(new, 0)

    def observe(self, observation: Observation) -> int:
        """Account the replicas running now and any newly observed minute; returns the extra levels."""
        assert self._context is not None, "reset() first"
        if self.shadow is None:
            self.shadow = ShadowHpa.start(self._context, observation.current_replicas)
            self._last_observed = observation.observed_minutes
            self._last_minute_s = observation.time_s
        new = self._new_minutes(observation)
        if new:
            own = self._own_sum / self._own_count if self._own_count else float(observation.current_replicas)
            load = observation.load_replicas if math.isfinite(observation.load_replicas) else 0.0
            leak = self.leak
            for _ in range(new):
                shadow = self.shadow.advance(load)
                self.balance = leak * self.balance + self.settings.ratio * shadow - own
                self.shadow_minutes = leak * self.shadow_minutes + shadow
                self.own_minutes = leak * self.own_minutes + own
                self.minutes = leak * self.minutes + 1.0
                self.gate.record(own, shadow)
            self._own_sum, self._own_count = 0.0, 0
            self._last_observed = observation.observed_minutes
            self._last_minute_s = observation.time_s
        self._own_sum += observation.current_replicas
        self._own_count += 1
        return self.levels
