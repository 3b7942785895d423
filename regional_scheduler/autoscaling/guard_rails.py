"""Guard rails: hard limits applied after any policy, whatever it proposed.

In order (a later rule wins over an earlier one):

1. **SLO breach → immediate scale-up**: while the observed latency SLO is breached the result is never a
   scale-down and is at least ``ceil(ready × utilisation / breach_target_utilisation)`` (the capacity the
   observed load needs, counting pods already starting) and at least ``current + 1`` unless a scale-up
   is already in flight (pods pending), so every breach gets a scale-up without compounding one per
   tick while the new pods start.
2. **Scale-down cool-down**: a scale-down is refused (replicas held) unless ``scale_down_cooldown_s``
   (3 min) have passed since the last one.
3. **Scale-down step**: one decision removes at most ``max_scale_down_fraction`` (50%) of the current
   replicas, i.e. the result is at least ``ceil(current × (1 − fraction))``.
4. **Bounds**: ``min_replicas ≤ result ≤ max_replicas`` (bounds win over everything, so a target already
   above ``max_replicas`` is brought down to it at once).

The rails keep their own memory (time of the last scale-down) and report which rule bound each decision,
so an operator sees why the learned policy was overridden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from regional_scheduler.autoscaling.settings import GuardRailSettings


@dataclass(frozen=True)
class GuardedDecision:
    """The replicas to actuate and the rails that changed the policy's proposal (empty if none)."""

    replicas: int
    proposed: int
    rails: tuple[str, ...]


@dataclass
class GuardRails:
    settings: GuardRailSettings
    last_scale_down_s: float | None = field(default=None)

    def reset(self) -> None:
        self.last_scale_down_s = None

    def apply(self, *, proposed: int, current: int, now_s: float, slo_breached: bool,
              utilisation: float | None, ready: int | None = None) -> GuardedDecision:
        """Guard ``proposed``; ``ready`` defaults to ``current`` (no pods pending)."""
        s = self.settings
        rails: list[str] = []
        result = int(proposed)
        ready = current if ready is None else min(ready, current)
        if slo_breached:
            ratio = (utilisation or 0.0) / s.breach_target_utilisation
            floor = max(current + 1 if ready == current else current, math.ceil(ready * ratio))
            if result < floor:
                result = floor
                rails.append("slo_breach_scale_up")
        if result < current:
            if self.last_scale_down_s is not None and now_s - self.last_scale_down_s < s.scale_down_cooldown_s:
                result = current
                rails.append("scale_down_cooldown")
            else:
                step_floor = math.ceil(current * (1.0 - s.max_scale_down_fraction))
                if result < step_floor:
                    result = step_floor
                    rails.append("scale_down_step")
        if result > s.max_replicas:
            result = s.max_replicas
            rails.append("max_replicas")
        if result < s.min_replicas:
            result = s.min_replicas
            rails.append("min_replicas")
        if result < current:
            self.last_scale_down_s = now_s
        return GuardedDecision(replicas=result, proposed=int(proposed), rails=tuple(rails))
