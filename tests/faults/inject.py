"""Fault-injection points of the fault suite: ``python -m tests.faults.inject MODE [ARGS…]`` patches one call
of the real product code, then runs the real entry point with ``ARGS`` in this process. The product
carries no test hooks; each fault lands exactly where a ``kill -9`` could, and deterministically.

Modes:

* ``crash-before-dispatch`` — the global scheduler (``meridian …`` CLI arguments) dies with exit code
  :data:`CRASH_EXIT_CODE` at its first publish to a dispatch stream: after ``store.flush()`` made the
  attempts durable, before any cluster heard of them.
* ``hang-before-events`` — the regional dispatch worker (``python -m regional_scheduler.dispatch_worker``
  arguments) stops for good at its first publish of placement events: the placements are applied in
  its memory, their dispatch entries read and not acknowledged. It first writes the file named by
  ``$MERIDIAN_FAULT_MARKER``, so the test knows when to ``kill -9`` it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from meridian.bus.redis_bus import RedisStreamBus

CRASH_EXIT_CODE = 70
_real_publish_many = RedisStreamBus.publish_many


def _crash_before_dispatch(self: RedisStreamBus, stream: str, payloads: Sequence[bytes], *,
                           maxlen: int | None = None) -> int:
    if stream.endswith(":dispatch"):
        os._exit(CRASH_EXIT_CODE)
    return _real_publish_many(self, stream, payloads, maxlen=maxlen)


def _hang_before_events(self: RedisStreamBus, stream: str, payloads: Sequence[bytes], *,
                        maxlen: int | None = None) -> int:
    if stream.endswith(":events"):
        Path(os.environ["MERIDIAN_FAULT_MARKER"]).write_text(f"{len(payloads)} events held back\n")
        while True:  # the fault: a worker hung before publishing its events, until the test kills it
            time.sleep(3600)
    return _real_publish_many(self, stream, payloads, maxlen=maxlen)


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    if mode == "crash-before-dispatch":
        RedisStreamBus.publish_many = _crash_before_dispatch  # type: ignore[method-assign]
        from meridian.cli import main as meridian_main

        sys.argv = ["meridian", *args]
        meridian_main()
        return 0
    if mode == "hang-before-events":
        RedisStreamBus.publish_many = _hang_before_events  # type: ignore[method-assign]
        from regional_scheduler.dispatch_worker import main as worker_main

        return worker_main(args)
    raise SystemExit(f"unknown fault {mode!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
