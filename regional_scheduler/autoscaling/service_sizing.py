"""Turn a request series into a service, the same way for every series.

The series gives demand in its own unit (requests, events, page views per minute). A replica's
capacity in that unit is fixed from the *training days only*::

    capacity_per_replica_rpm = quantile_q(training rate per minute) / (target_utilisation × reference_replicas)

so the training days' q-quantile minute needs exactly ``reference_replicas`` replicas at the HPA target.
A replica is ``workers`` cores, so one unit of the series costs ``workers × 60 / capacity_per_replica_rpm``
core-seconds: CPU per request is whatever makes the series' own busy minutes a 20-replica service, and the
latency model (:mod:`queueing`) only sees utilisation, so it needs no per-series constant. Every
simulator quantity is then expressed as *load in replicas at 100%* (``rate / capacity``), which makes the
learned policy's inputs comparable across series and lets a new series run without tuning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from regional_scheduler.autoscaling.settings import ServiceSettings, SizingSettings


@dataclass(frozen=True)
class ServiceSizing:
    """A service derived from a series' training days."""

    capacity_per_replica_rpm: float
    cpu_seconds_per_request: float
    target_utilisation: float
    reference_replicas: int
    min_replicas: int
    max_replicas: int

    def load_in_replicas(self, requests_per_minute: np.ndarray) -> np.ndarray:
        """Demand expressed as replicas busy at 100% (NaN stays NaN)."""
        return np.asarray(requests_per_minute, dtype=float) / self.capacity_per_replica_rpm


def size_service(training_rpm: np.ndarray, sizing: SizingSettings, service: ServiceSettings) -> ServiceSizing:
    """Size from training minutes only (NaN ignored); see the module docstring."""
    observed = training_rpm[np.isfinite(training_rpm)]
    if observed.size == 0:
        raise ValueError("no observed training minutes to size the service from")
    reference = float(np.quantile(observed, sizing.reference_quantile))
    if reference <= 0:
        reference = float(observed.max()) or 1.0
    capacity = reference / (sizing.target_utilisation * sizing.reference_replicas)
    # A replica is `workers` cores busy for 60 s per minute at 100%, i.e. `workers × 60` core-seconds per
    # minute spread over `capacity` series units: CPU per series unit in core-seconds.
    cpu_per_request = service.workers_per_replica * 60.0 / capacity
    return ServiceSizing(
        capacity_per_replica_rpm=capacity,
        cpu_seconds_per_request=cpu_per_request,
        target_utilisation=sizing.target_utilisation,
        reference_replicas=sizing.reference_replicas,
        min_replicas=sizing.min_replicas,
        max_replicas=math.ceil(sizing.max_replicas_factor * sizing.reference_replicas),
    )
