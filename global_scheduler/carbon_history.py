"""Each region's observed grid intensity by UTC hour, and the day-ahead forecast made from it.

The federation simulator (and so the GNN's training) forecasts the next hours as the same hours one day
earlier (seasonal naive, no future data). Live, the registry does the same from what the clusters'
summaries reported: :meth:`HourlyCarbonHistory.day_ahead` gives, for hours ``h … h+H-1``, the mean
intensity observed at ``h-24 … h+H-25``, and the current intensity for any hour not observed (a fresh
scheduler forecasts "flat" until it has a day of history, which is what it did before).
"""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np

SECONDS_PER_HOUR = 3600


class HourlyCarbonHistory:
    def __init__(self, *, hours_kept: int = 48) -> None:
        self.hours_kept = hours_kept
        self._lock = threading.Lock()
        # region -> hour index (unix hours) -> [sum, count]
        self._by_region: dict[str, dict[int, list[float]]] = defaultdict(dict)

    def observe(self, region: str, unix_s: float, g_per_kwh: float) -> None:
        if not np.isfinite(g_per_kwh) or g_per_kwh < 0:
            return  # an agent without a carbon source reports nothing useful; never poison the forecast
        hour = int(unix_s // SECONDS_PER_HOUR)
        with self._lock:
            hours = self._by_region[region]
            acc = hours.setdefault(hour, [0.0, 0])
            acc[0] += g_per_kwh
            acc[1] += 1
            if len(hours) > self.hours_kept:
                for old in [h for h in hours if h <= hour - self.hours_kept]:
                    del hours[old]

    def day_ahead(self, regions: list[str], now_unix_s: float, current: np.ndarray, hours: int) -> np.ndarray:
        """``(len(regions), hours)`` forecast for the hours from now; ``current[i]`` where not observed."""
        now_h = int(now_unix_s // SECONDS_PER_HOUR)
        out = np.repeat(np.asarray(current, dtype=np.float64)[:, None], hours, axis=1)
        with self._lock:
            for i, region in enumerate(regions):
                seen = self._by_region.get(region)
                if not seen:
                    continue
                for k in range(hours):
                    acc = seen.get(now_h + k - 24)
                    if acc is not None:
                        out[i, k] = acc[0] / acc[1]
        return out
