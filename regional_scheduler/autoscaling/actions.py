"""The learned policy's actions: replica changes chosen as head-room over the forecast.

Action ``0`` keeps the current replica count (a change of 0). The other actions change the replicas to

* ``ceil((forecast peak + z × spread) / u_slo)`` for ``z`` in :data:`HEADROOM_Z` (the median seasonal
  forecast, as the forecast policy), or
* ``ceil((upper forecast peak + z × spread) / u_slo)`` for ``z`` in :data:`BURST_HEADROOM_Z`, where the
  upper forecast is the previous days' upper quantile at this clock time (recurring bursts),

i.e. a replica change of that target minus the current count. The DQN therefore learns *how much
head-room to hold in which state* (time of day, minute of the hour, recent noise, rising or falling load,
a burst seen here on earlier days) rather than absolute replica counts, which is what makes one small
network work across services of any size.
"""

from __future__ import annotations

import math

from regional_scheduler.autoscaling.policies.base import (
    PolicyContext,
    forecast_needed_load,
    forecast_spread,
    forecast_upper_load,
)
from regional_scheduler.autoscaling.simulator import Observation

HEADROOM_Z: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
BURST_HEADROOM_Z: tuple[float, ...] = (0.0, 0.5, 1.0)
HOLD = 0
N_ACTIONS = 1 + len(HEADROOM_Z) + len(BURST_HEADROOM_Z)


def proposed_replicas(action: int, context: PolicyContext, obs: Observation, slo_utilisation: float) -> int:
    """The replica count action ``action`` proposes at ``obs`` (before guard rails)."""
    if action == HOLD:
        return obs.current_replicas
    if action <= len(HEADROOM_Z):
        needed = forecast_needed_load(context, obs) + HEADROOM_Z[action - 1] * forecast_spread(context, obs)
    else:
        z = BURST_HEADROOM_Z[action - 1 - len(HEADROOM_Z)]
        needed = forecast_upper_load(context, obs) + z * forecast_spread(context, obs)
    return math.ceil(needed / slo_utilisation)
