"""The loop every stream worker runs around its step: call it until stopped, and back off while the bus
cannot be reached.

A worker's step reads its stream through a consumer group (a dead consumer's pending entries claimed
with ``XAUTOCLAIM`` first), applies what it read, dead-letters what it cannot apply (with the reason;
a malformed message never stops a consumer) and acknowledges only after applying, so a worker killed
in between leaves its entries pending for whoever claims them (ARCHITECTURE.md, "The fabric"). What
differs between workers is the step; :func:`run_with_backoff` is the loop around it, and
:func:`backoff_delay` the one rule for how long to wait: the next of a sequence of delays, the last
repeating, starting over after a step that succeeds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from meridian.bus.base import BusError


def backoff_delay(delays: Sequence[float], failures: int) -> float:
    """The wait after ``failures`` earlier consecutive failures: ``delays[failures]``, the last repeating."""
    return delays[min(failures, len(delays) - 1)]


def run_with_backoff(stop: threading.Event, step: Callable[[], object], *, delays: Sequence[float],
                     on_failure: Callable[[Exception, float], None],
                     retry_on: tuple[type[Exception], ...] = (BusError,)) -> None:
    """Call ``step`` until ``stop`` is set. When it raises one of ``retry_on``, ``on_failure(exc, delay)``
    says why (and resets whatever the worker must redo, such as its group), then the loop waits ``delay``
    (:func:`backoff_delay`) or until stopped; anything else propagates."""
    failures = 0
    while not stop.is_set():
        try:
            step()
        except retry_on as exc:
            delay = backoff_delay(delays, failures)
            failures += 1
            on_failure(exc, delay)
            stop.wait(delay)
        else:
            failures = 0
