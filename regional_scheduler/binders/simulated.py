"""``simulated``: bindings kept in memory, for the benchmarks, the demo and dispatch onto simulated
clusters (no API server). A binding is made at once and can be taken back with :meth:`unbind`."""

from __future__ import annotations

import threading

from regional_scheduler.binders.base import BindConflictError, BindRequest

NAME = "simulated"


class SimulatedBinder:
    name = NAME

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bound: dict[str, str] = {}  # pod uid -> node

    def bind(self, request: BindRequest) -> None:
        with self._lock:
            if request.uid in self.bound:
                raise BindConflictError(f"pod {request.key} is already bound to {self.bound[request.uid]}")
            self.bound[request.uid] = request.node

    def unbind(self, uid: str) -> None:
        with self._lock:
            self.bound.pop(uid, None)
