"""Helpers for tests of the global scheduler's API: the federation fixture's token, a workload spec,
and polling waits on a condition or a workload's state (not a test module, so tests import it freely)."""

from __future__ import annotations

import time
from collections.abc import Callable

from protos import global_api_pb2 as api

TOKEN = "test-token"  # the federation fixture's token
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def wait_for(predicate: Callable[[], object], timeout_s: float = 30.0, what: str = "condition") -> object:
    """Poll ``predicate`` every 50 ms until it returns something true (returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def spec(**kw: object) -> api.WorkloadSpec:
    """A small workload (2 replicas of 2 CPUs and 4 GiB), with ``kw`` overriding any field."""
    base: dict[str, object] = {"name": "web", "tenant": "shop", "replicas": 2,
                               "requests": api.ResourceQuantities(cpu="2", memory="4Gi")}
    base.update(kw)
    return api.WorkloadSpec(**base)


def wait_state(stub, wid: str, state: int, timeout_s: float = 30.0) -> api.Workload:
    """Poll the API until workload ``wid`` is in ``state``; returns it."""
    return wait_for(lambda: (w := stub.GetWorkload(api.GetWorkloadRequest(id=wid), metadata=AUTH)).state == state and w,
                    timeout_s, f"workload {wid} to reach {api.WorkloadState.Name(state)}")
