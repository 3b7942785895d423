"""The autoscaling tier's learning records: one window of one deployment's request rate per minute.

``data`` holds what the retrainer rebuilds the deployment from, and nothing it could not know live:

* ``requests_per_minute``: the window's rate per minute, a missing minute (a scrape gap) carried as the
  last known rate, as the simulator and the drift detectors both take it;
* ``observed``: 1.0 for a measured minute, 0.0 for a missing one (JSON has no NaN, and a missing minute
  must stay out of the SLO accounting);
* ``capacity_per_replica_rpm``: requests per minute one replica serves at 100 % (the service's CPU per
  request; a regime change of traffic does not change it).

``features["request_rate"]`` is the same per-minute rate, for the drift detectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from meridian.lifecycle.records import LearningRecord
from regional_scheduler.autoscaling.lifecycle_replay import Deployment

MODEL = "autoscaling"
REQUEST_RATE = "request_rate"


class RecordsError(ValueError):
    """The records hold no window this tier can train on."""


def hold_last(requests_per_minute: np.ndarray) -> np.ndarray:
    """Missing minutes (NaN) carried as the last known rate (leading ones as the first), the simulator's rule."""
    known = np.isfinite(requests_per_minute)
    if not known.any():
        return np.zeros_like(requests_per_minute, dtype=float)
    idx = np.maximum.accumulate(np.where(known, np.arange(requests_per_minute.size), 0))
    filled = np.asarray(requests_per_minute, dtype=float)[idx]
    filled[~np.isfinite(filled)] = requests_per_minute[known][0]
    return filled


def encode_window(requests_per_minute: np.ndarray, held: np.ndarray,
                  capacity_per_replica_rpm: float) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """A window's ``features`` and ``data`` from its raw rate (NaN = missing) and the held rate."""
    rates = [round(float(x), 6) for x in held]
    observed = np.isfinite(requests_per_minute).astype(float).tolist()
    return ({REQUEST_RATE: rates},
            {"requests_per_minute": rates, "observed": observed,
             "capacity_per_replica_rpm": [float(capacity_per_replica_rpm)]})


def deployment_from_records(records: Sequence[LearningRecord]) -> Deployment:
    """The request series of the newest record's deployment, minute by minute from its first record; a
    minute no record covers (a lost record) is missing, as a scrape gap is."""
    usable = [r for r in records if r.data.get("requests_per_minute")]
    if not usable:
        raise RecordsError("no autoscaling record carries data['requests_per_minute']")
    source = max(usable, key=lambda r: r.window).source
    own = sorted((r for r in usable if r.source == source), key=lambda r: r.window)
    start: datetime = own[0].start
    offsets = [round((r.start - start).total_seconds() / 60) for r in own]
    minutes = max(o + len(r.data["requests_per_minute"]) for o, r in zip(offsets, own, strict=True))
    rate = np.full(minutes, np.nan)
    for offset, record in zip(offsets, own, strict=True):
        values = np.asarray(record.data["requests_per_minute"], dtype=float)
        observed = np.asarray(record.data.get("observed", [1.0] * values.size), dtype=float) > 0.5
        rate[offset:offset + values.size] = np.where(observed, values, np.nan)
    capacity = float(own[-1].data["capacity_per_replica_rpm"][0])  # type: ignore[arg-type]
    return Deployment(name=source, start=start, requests_per_minute=rate, capacity_per_replica_rpm=capacity)
