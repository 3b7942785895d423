"""One pass of the global router: decide a batch of workloads over one snapshot of the clusters.

The decisions of a pass are sequential: each one reserves what it assigns in the snapshot, so the
next sees the clusters as the earlier ones left them (a batch spreads as it would one by one). The
pass is pure, given the policy: it reads the snapshot and the workloads and returns decisions; the
engine applies them (store, registry reservations, dispatch). That is what lets it run in another
process.

:class:`RoutingWorker` runs passes in a child process with its own copy of the policy. Routing is
CPU work in Python (feature building, the filter, the GNN's refinement); in the API's process it
competes with the gRPC handler threads for the interpreter lock. In `meridian bench api` on a 2-core
machine at 1,000 submits/s, routing in-process gave SubmitWorkload p99 180-227 ms and a router that
fell 15-25 s behind over a minute; with routing held off during the load, the API alone answered at p99
6-23 ms (docs/history/benchmarks-diary.md). If the worker dies or a pass fails there, the engine routes
that pass in its own process and starts a new worker for the next one; since a pass has no side
effects, nothing is decided twice.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from global_scheduler.routing.base import Router, fallbacks_of
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures, crit_utilisation


@dataclass
class PassItem:
    """One workload of a pass: its routing features, the clusters that rejected it, and what it takes
    (all replicas: milli-CPU, memory bytes, GPUs)."""

    features: WorkloadFeatures
    excluded: frozenset[str]
    need: tuple[float, float, float]


@dataclass
class PassDecision:
    """``cluster``: an index into the pass's names, ``DEFER`` or ``NO_CLUSTER``; ``slo_crit``: for a placed
    latency-sensitive workload, the utilisation at which its SLO breaks there."""

    cluster: int
    diagnosis: dict[str, int]
    explain: str
    slo_crit: float | None
    seconds: float


@dataclass
class PassResult:
    decisions: list[PassDecision]
    fallbacks: int  # the policy's count of model failures so far (it answered with its fallback)
    pid: int  # the process whose policy decided (each has its own fallback count)


def decide_pass(router: Router, names: list[str], feats: ClusterFeatures, items: list[PassItem]) -> PassResult:
    """Decide every item in order, reserving each assignment in ``feats`` (which it changes)."""
    # One batched forward pass for the whole batch when the policy offers it (the GNN); each decision is
    # still filtered, refined and selected on the clusters as earlier ones in the batch left them.
    batch_scores = None
    per_decision_batch_s = 0.0
    if router.batch_scorer is not None and len(items) > 1:
        t0 = time.perf_counter()
        batch_scores = router.batch_scorer.score_batch(feats, [it.features for it in items])
        per_decision_batch_s = (time.perf_counter() - t0) / len(items)
    out = []
    for k, it in enumerate(items):
        wf = it.features
        t0 = time.perf_counter()
        if batch_scores is not None:
            mask = np.array([n in it.excluded for n in names]) if it.excluded else None
            decision = router.decide_scored(feats, wf, batch_scores[k], mask)
        else:
            view = _without(feats, [i for i, n in enumerate(names) if n in it.excluded]) if it.excluded else feats
            decision = router.decide(lambda view=view: view, wf)
        elapsed = time.perf_counter() - t0 + per_decision_batch_s
        crit = None
        c = decision.cluster
        if c >= 0:
            feats.free_milli_cpu[c] = max(0.0, feats.free_milli_cpu[c] - it.need[0])
            feats.free_memory_bytes[c] = max(0.0, feats.free_memory_bytes[c] - it.need[1])
            feats.free_gpu[c] = max(0.0, feats.free_gpu[c] - it.need[2])
            if wf.latency_slo_ms > 0 and wf.origin_region >= 0:
                crit = float(crit_utilisation(feats.rtt_ms[wf.origin_region, feats.region_index[c]],
                                              np.array(wf.latency_slo_ms), feats.service_ms))
                feats.tightest_slo_utilisation[c] = min(feats.tightest_slo_utilisation[c], crit)
        out.append(PassDecision(c, decision.diagnosis, decision.explain(len(names)), crit, elapsed))
    return PassResult(out, fallbacks_of(router.policy), os.getpid())


def _without(feats: ClusterFeatures, excluded: list[int]) -> ClusterFeatures:
    ready = feats.ready.copy()
    ready[excluded] = False
    return ClusterFeatures(**{**feats.__dict__, "ready": ready})


# ---------------------------------------------------------------------------- the worker process
_worker_router: Router | None = None


def _init_worker(policy: str, policy_kwargs: dict[str, Any], nice: int) -> None:
    global _worker_router
    import torch

    from global_scheduler.routing.registry import get_policy

    torch.set_num_threads(1)  # one core's worth: the API's process has the other
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    if nice:
        os.nice(nice)  # when cores are scarce the kernel serves the API first: routing is the work that can wait
    _worker_router = Router(get_policy(policy, **policy_kwargs))


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """A parent killed outright (SIGKILL, OOM) never shuts the pool down, and the child would wait on its
    queue for ever, holding its memory: it leaves once it has been re-parented."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(0)


def _pass_in_worker(names: list[str], feats: ClusterFeatures, items: list[PassItem]) -> PassResult:
    assert _worker_router is not None, "routing worker not initialised"
    return decide_pass(_worker_router, names, feats, items)


def _ping() -> int:
    return os.getpid()


class RoutingWorkerRestingError(RuntimeError):
    """The worker failed recently and is not restarted before its back-off ends."""


class RoutingWorker:
    """Runs :func:`decide_pass` in one child process (spawned, so it shares no lock or thread with the
    API's process). :meth:`run` raises whatever went wrong; the caller decides in-process instead. After a
    failure the next start waits ``retry_after_s``, so a worker that cannot start (no memory, a daemonic
    parent) is not spawned again on every pass."""

    def __init__(self, policy: str, policy_kwargs: dict[str, Any] | None = None, *, timeout_s: float = 30.0,
                 start_timeout_s: float = 120.0, retry_after_s: float = 30.0, nice: int = 0) -> None:
        self.policy, self.policy_kwargs, self.nice = policy, dict(policy_kwargs or {}), nice
        self.timeout_s, self.start_timeout_s, self.retry_after_s = timeout_s, start_timeout_s, retry_after_s
        self.pid: int | None = None
        self.restarts = 0
        self._pool: ProcessPoolExecutor | None = None
        self._retry_at = 0.0

    def start(self) -> int:
        """Start the child and wait until it has built its policy; returns its pid."""
        try:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                                 initializer=_init_worker,
                                                 initargs=(self.policy, self.policy_kwargs, self.nice))
            self.pid = self._pool.submit(_ping).result(timeout=self.start_timeout_s)
        except BaseException:
            self._fail()
            raise
        return self.pid

    def run(self, names: list[str], feats: ClusterFeatures, items: list[PassItem]) -> PassResult:
        if self._pool is None:
            if time.monotonic() < self._retry_at:
                raise RoutingWorkerRestingError(f"routing worker failed; next start in "
                                                f"{self._retry_at - time.monotonic():.0f} s")
            self.restarts += 1
            self.start()
        assert self._pool is not None
        try:
            return self._pool.submit(_pass_in_worker, names, feats, items).result(timeout=self.timeout_s)
        except BaseException:
            self._fail()  # a broken or stuck child: a later pass starts a new one
            raise

    def _fail(self) -> None:
        self.close()
        self._retry_at = time.monotonic() + self.retry_after_s

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if self.pid is not None:
            # A stuck child would hold up a waiting shutdown, so it is killed rather than asked.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.pid = None
        pool.shutdown(wait=False, cancel_futures=True)
