"""Latency of one replica as an M/M/c queue (Erlang C), vectorised over utilisations.

A replica has ``c`` workers, each serving a request in ``s`` seconds on average, so it serves ``c/s``
requests per second. At utilisation ``ρ = λ / (c/s)`` the probability that a request waits is Erlang C
``C(c, cρ)`` and the wait is exponential with rate ``c/s − λ``, so the p-quantile of the wait is
``max(0, ln(C / (1 − p))) / (c/s − λ)``. The p99 response time is taken as ``s + wait_p99`` (the service
time's own spread is ignored: a documented approximation that keeps latency a function of utilisation).
At or above saturation the queue grows; that backlog is handled by the simulator as a fluid and adds
``backlog / capacity`` seconds.
"""

from __future__ import annotations

import math

import numpy as np

SATURATED = 0.999


def erlang_c(workers: int, utilisation: np.ndarray) -> np.ndarray:
    """Probability of waiting in an M/M/c queue with ``workers`` servers at ``utilisation`` (< 1)."""
    rho = np.clip(np.asarray(utilisation, dtype=float), 0.0, SATURATED)
    offered = workers * rho
    terms = np.stack([offered**k / math.factorial(k) for k in range(workers)])
    below = terms.sum(axis=0)
    top = offered**workers / math.factorial(workers) / (1.0 - rho)
    return top / (below + top)


def p99_latency_s(utilisation: np.ndarray, *, workers: int, service_time_s: float,
                  quantile: float = 0.99) -> np.ndarray:
    """p99 response time in seconds of one replica below saturation (see the module docstring)."""
    rho = np.clip(np.asarray(utilisation, dtype=float), 0.0, SATURATED)
    wait_probability = erlang_c(workers, rho)
    headroom_rps = workers / service_time_s * (1.0 - rho)
    wait = np.maximum(0.0, np.log(np.maximum(wait_probability, 1e-300) / (1.0 - quantile))) / headroom_rps
    return service_time_s + wait


def max_utilisation_within_slo(*, workers: int, service_time_s: float, slo_s: float) -> float:
    """Highest utilisation whose p99 stays within the SLO (bisection; p99 rises with utilisation)."""
    low, high = 0.0, SATURATED
    for _ in range(50):
        mid = (low + high) / 2
        if float(p99_latency_s(np.array(mid), workers=workers, service_time_s=service_time_s)) <= slo_s:
            low = mid
        else:
            high = mid
    return low
