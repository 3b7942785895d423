"""The node agent: collect, report, publish — on an interval with jitter, through outages.

Design
------
A *reporter* makes serialised ``NodeTelemetry`` reports for "now": :class:`NodeReporter` for the
machine it runs on (procfs/cgroup usage, RAPL or modelled power, the node's Kubernetes object,
grid intensity) or :class:`SimulatedReporter` for many simulated nodes from one process (a
:class:`~meridian.fleet.SimulatedFleet`). :class:`NodeAgent` is the loop (kopf-like worker:
keyword-only parameters, one loop that cleans up after itself): every ``interval_s ± jitter_s`` it
asks the reporter for reports, hands them to the :class:`~node_agent.publisher.ReportPublisher`
(bounded buffer, back-off) and flushes.

Sequences start at ``unix_ms × 1000`` and increase by one per report, so they keep increasing
across agent restarts and the regional consumer's idempotence check (node, sequence) holds.

Hazards
-------
* The agent makes no decisions: a failing collector degrades the report (``None`` usage is sent as
  0 and RAPL falls back to the model), it never stops reporting liveness.
* Jitter comes from a seeded RNG per node name so restarts of the whole fleet spread out the same way.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Protocol

from meridian.fleet import SimulatedFleet
from node_agent.collectors.carbon import CarbonCollector
from node_agent.collectors.kube import KubeNodeCollector, NodeInfo
from node_agent.collectors.power import PowerCollector
from node_agent.collectors.usage import CgroupUsage, ProcUsage
from node_agent.publisher import ReportPublisher
from protos import telemetry_pb2 as pb

log = logging.getLogger(__name__)


class Reporter(Protocol):
    n_nodes: int

    def reports(self, now_s: float) -> list[bytes]: ...


class NodeReporter:
    """Reports for the node this agent runs on."""

    n_nodes = 1

    def __init__(self, *, cluster: str, region: str, node: NodeInfo, pue: float, usage: ProcUsage,
                 cgroup: CgroupUsage | None, power: PowerCollector, carbon: CarbonCollector,
                 kube: KubeNodeCollector | None = None, labels_every: int = 30) -> None:
        self.cluster, self.region, self.node, self.pue = cluster, region, node, pue
        self.usage, self.cgroup, self.power, self.carbon, self.kube = usage, cgroup, power, carbon, kube
        self.labels_every = labels_every
        self.sequence = int(time.time() * 1000) * 1000
        self.first_sequence = self.sequence + 1

    def report(self, now_s: float) -> pb.NodeTelemetry:
        if self.kube is not None:
            self.node = self.kube.read(now_s) or self.node
        node = self.node
        usage = self.usage.read()
        pods = self.cgroup.read(now_s) if self.cgroup is not None else None
        power = self.power.read(now_s, usage.cpu_utilisation)
        intensity, carbon_source = self.carbon.read(now_s)
        self.sequence += 1
        now_ms = int(now_s * 1000)
        m = pb.NodeTelemetry(
            cluster=self.cluster, region=self.region, node=node.name, sequence=self.sequence,
            observed_unix_ms=now_ms, sent_unix_ms=now_ms,
            capacity_milli_cpu=node.capacity_milli_cpu, capacity_memory_bytes=node.capacity_memory_bytes,
            capacity_gpu=node.capacity_gpu,
            allocatable_milli_cpu=node.allocatable_milli_cpu or node.capacity_milli_cpu,
            allocatable_memory_bytes=node.allocatable_memory_bytes or node.capacity_memory_bytes,
            allocatable_gpu=node.allocatable_gpu,
            requested_milli_cpu=node.requested_milli_cpu, requested_memory_bytes=node.requested_memory_bytes,
            used_milli_cpu=usage.used_milli_cpu or 0.0, used_memory_bytes=usage.used_memory_bytes or 0.0,
            pods_used_milli_cpu=(pods.used_milli_cpu or 0.0) if pods else 0.0,
            pods_used_memory_bytes=(pods.used_memory_bytes or 0.0) if pods else 0.0,
            power_watts=power.power_watts, power_source=power.source, energy_joules=power.energy_joules,
            carbon_g_per_kwh=intensity, carbon_source=carbon_source, pue=self.pue,
            gpu_model=node.gpu_model, unschedulable=node.unschedulable,
        )
        if node.allocatable_gpu:
            free = max(node.allocatable_gpu - node.requested_gpu, 0)
            m.gpu_free_milli.extend([1000] * free + [0] * (node.allocatable_gpu - free))
        if (self.sequence - self.first_sequence) % self.labels_every == 0:
            m.labels_included = True
            m.labels.update(node.labels)
            for key, value, effect in node.taints:
                m.taints.add(key=key, value=value, effect=effect)
        return m

    def reports(self, now_s: float) -> list[bytes]:
        return [self.report(now_s).SerializeToString()]


class SimulatedReporter:
    """Reports for a simulated fleet (``meridian agent --simulate-nodes N``)."""

    def __init__(self, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self.n_nodes = fleet.n_nodes

    def reports(self, now_s: float) -> list[bytes]:
        self.fleet.advance(now_s)
        return self.fleet.reports(now_s)


class NodeAgent:
    def __init__(self, *, reporter: Reporter, publisher: ReportPublisher, interval_s: float = 2.0,
                 jitter_s: float = 0.2, seed: str = "", clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.reporter, self.publisher = reporter, publisher
        self.interval_s, self.jitter_s = interval_s, jitter_s
        self.clock, self.monotonic = clock, monotonic
        self._rng = random.Random(seed)
        self.ticks_total = 0
        self.last_tick_s: float | None = None

    def tick(self) -> bool:
        """Report once and try to publish everything buffered; True if the bus took it."""
        self.publisher.submit(self.reporter.reports(self.clock()))
        ok = self.publisher.flush()
        self.ticks_total += 1
        self.last_tick_s = self.monotonic()
        return ok

    def next_delay_s(self) -> float:
        return max(self.interval_s + self._rng.uniform(-self.jitter_s, self.jitter_s), 0.0)

    def live(self) -> bool:
        return self.last_tick_s is None or self.monotonic() - self.last_tick_s < 3 * self.interval_s + 10

    def ready(self) -> bool:
        last = self.publisher.last_success_s
        return last is not None and self.monotonic() - last < 5 * self.interval_s + 10

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = self.monotonic()
            try:
                self.tick()
            except Exception:  # a collector bug must not kill liveness reporting for good
                log.exception("agent tick failed")
            stop.wait(max(self.next_delay_s() - (self.monotonic() - started), 0.0))
        self.publisher.flush()  # last attempt to deliver what is buffered
