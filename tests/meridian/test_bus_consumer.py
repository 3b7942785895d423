"""``meridian.bus.consumer``: the back-off loop every stream worker runs around its step."""

from __future__ import annotations

import threading

import pytest

from meridian.bus import BusError, BusUnavailableError
from meridian.bus.consumer import backoff_delay, run_with_backoff


class RecordingStop(threading.Event):
    """A stop event whose waits are recorded instead of slept."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0.0))
        return self.is_set()


def test_delays_follow_the_sequence_the_last_repeating() -> None:
    assert [backoff_delay((0.1, 0.5, 2.0), n) for n in range(5)] == [0.1, 0.5, 2.0, 2.0, 2.0]


def test_failures_back_off_and_a_success_starts_over() -> None:
    stop = RecordingStop()
    outcomes = iter(["down", "down", "down", "ok", "down", "ok", "stop"])
    said: list[tuple[str, float]] = []

    def step() -> None:
        outcome = next(outcomes)
        if outcome == "down":
            raise BusUnavailableError("connection refused")
        if outcome == "stop":
            stop.set()

    run_with_backoff(stop, step, delays=(0.1, 0.5), on_failure=lambda exc, delay: said.append((str(exc), delay)))
    assert stop.waits == [0.1, 0.5, 0.5, 0.1]
    assert said == [("connection refused", 0.1), ("connection refused", 0.5), ("connection refused", 0.5),
                    ("connection refused", 0.1)]


def test_errors_outside_retry_on_propagate() -> None:
    stop = RecordingStop()

    def step() -> None:
        raise BusError("refused by ACL")

    with pytest.raises(BusError):
        run_with_backoff(stop, step, delays=(0.1,), on_failure=lambda exc, delay: None,
                         retry_on=(BusUnavailableError,))
    assert stop.waits == []
