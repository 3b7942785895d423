"""A client-side rate limit on API calls, as client-go's token bucket (``flowcontrol.NewTokenBucketRateLimiter``).

kube-scheduler's ``clientConnection.qps`` and ``burst`` (defaults 50 and 100) throttle every request
it makes to the API server; Meridian's scheduler honours the same two settings so that the two can be
compared with the same client limits, and so that a platform team's API server sees the load it was
sized for. ``qps <= 0`` disables the limit.
"""

from __future__ import annotations

import threading
import time


class TokenBucket:
    def __init__(self, qps: float, burst: int, *, clock=time.monotonic, sleep=time.sleep) -> None:
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self.qps = float(qps)
        self.burst = int(burst)
        self._tokens = float(burst)
        self._last = clock()
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, waiting for it if needed; returns the seconds waited."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0  # reserve now, so waiters queue in arrival order
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait
