"""The serving loop of ``meridian autoscaler``: metrics in, a guarded replica count out, to the target.

Each iteration reads the target's ``spec.replicas`` from its scale subresource (when a driver is given),
takes one reading from the metrics source, asks the :class:`OnlineAutoscaler` for a decision and writes
it to the scale subresource when it differs. Then it waits ``interval_s`` through the injected ``wait``
(``threading.Event.wait`` in the CLI: it returns ``True`` to stop; a test passes one that returns at
once, so the loop runs with no sleeps; the autoscaler's own clock is its minute count).

Metrics:

* :class:`PrometheusMetrics`: the request rate, p99 and error ratio, and when its CPU queries are
  configured the target's CPU utilisation with its ready and unready pods
  (:mod:`.prometheus_source`), which is what the ``hpa`` policy scales on. A failed query skips the
  decision (the replicas stay as they are) rather than acting on a guess.
* :class:`ReplayMetrics`: a request-rate series, one value per iteration (a demo and a dry run).

A policy that scales on utilisation (:class:`ScalesOnUtilisation`: ``hpa``), live or shadow, is refused
before the loop starts when the source supplies none and the autoscaler does not model it
(:class:`MissingMetricError`, naming the metric and the options that supply it): without utilisation
the HPA algorithm never scales, and a loop that silently never scales is worse than one that does not
start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from regional_scheduler.autoscaling.online import OnlineAutoscaler, ServiceSample
from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy, ScalesOnUtilisation
from regional_scheduler.autoscaling.prometheus_source import (
    CpuUtilisation,
    PrometheusQueryError,
    PrometheusSource,
)
from regional_scheduler.autoscaling.shadow import ShadowRunner

if TYPE_CHECKING:
    from regional_scheduler.autoscaling.k8s_driver import ScaleSubresourceDriver

log = logging.getLogger(__name__)

#: The CLI options that give a Prometheus source the CPU utilisation (see :mod:`.prometheus_source`).
UTILISATION_OPTIONS = "--cpu-usage-query and --cpu-request-query (optionally --ready-query)"


class MissingMetricError(ValueError):
    """A policy needs a metric the configured source does not supply."""


@dataclass(frozen=True)
class Reading:
    """One sample of the target as the metrics source reports it."""

    requests_per_minute: float
    p99_latency_ms: float = 0.0
    error_rate: float = 0.0
    cpu: CpuUtilisation | None = None


class MetricsSource(Protocol):
    """Where the loop's readings come from."""

    @property
    def supplies_utilisation(self) -> bool: ...

    def read(self) -> Reading:
        """The next reading; :class:`PrometheusQueryError` when unavailable, :class:`StopIteration` when a
        finite source is exhausted."""
        ...


@dataclass(frozen=True)
class PrometheusMetrics:
    source: PrometheusSource

    @property
    def supplies_utilisation(self) -> bool:
        return self.source.queries.supplies_utilisation

    def read(self) -> Reading:
        rate, p99_ms, errors = self.source.sample()
        return Reading(rate, p99_ms, errors, self.source.cpu())


class ReplayMetrics:
    """A request-rate series replayed one value per iteration (missing values as 0)."""

    supplies_utilisation = False

    def __init__(self, rates: Iterable[float]) -> None:
        self._rates: Iterator[float] = iter(rates)

    def read(self) -> Reading:
        value = float(next(self._rates))
        return Reading(value if math.isfinite(value) else 0.0)


def policies_of(policy: AutoscalingPolicy) -> list[AutoscalingPolicy]:
    """The policies that decide: a shadow runner's live and shadow policy, else the policy itself."""
    if isinstance(policy, ShadowRunner):
        return [*policies_of(policy.live), *policies_of(policy.shadow)]
    return [policy]


def check_metrics(online: OnlineAutoscaler, source: MetricsSource) -> None:
    """Refuse a policy that scales on utilisation when the source cannot give it (see the module docstring)."""
    if source.supplies_utilisation or online.model_utilisation:
        return
    for policy in policies_of(online.policy):
        if isinstance(policy, ScalesOnUtilisation):
            raise MissingMetricError(
                f"policy {policy.name!r} scales on {policy.utilisation_metric()} and the metrics source supplies "
                f"no CPU utilisation: give the Prometheus queries {UTILISATION_OPTIONS}, or choose a policy "
                "that scales on the request rate")


class ServingLoop:
    def __init__(self, online: OnlineAutoscaler, source: MetricsSource, *,
                 driver: ScaleSubresourceDriver | None = None, interval_s: float = 60.0,
                 wait: Callable[[float], bool] = lambda _s: False, initial_replicas: int = 1) -> None:
        check_metrics(online, source)
        self.online = online
        self.source = source
        self.driver = driver
        self.interval_s = interval_s
        self.wait = wait
        self.replicas = initial_replicas

    def step(self) -> int | None:
        """One iteration: the desired replicas (written to the target if they differ), or ``None`` when the
        metrics were unavailable (nothing changes). Raises :class:`StopIteration` when the source ends."""
        if self.driver is not None:
            self.replicas = self.driver.current()[0]
        try:
            reading = self.source.read()
        except PrometheusQueryError as exc:
            log.error("metrics unavailable, keeping %d replicas: %s", self.replicas, exc)
            return None
        cpu = reading.cpu
        if cpu is not None:
            sample = ServiceSample(reading.requests_per_minute, cpu.ready_pods, cpu.unready_pods, cpu.utilisation,
                                   reading.p99_latency_ms, reading.error_rate, current_replicas=self.replicas)
        else:
            sample = ServiceSample(reading.requests_per_minute, self.replicas, 0, None, reading.p99_latency_ms,
                                   reading.error_rate, current_replicas=self.replicas)
        desired = self.online.update(sample)
        if self.driver is not None and desired != self.replicas:
            self.driver.set_replicas(desired)
        if self.driver is None:
            self.replicas = desired
        runner = self.online.policy
        if isinstance(runner, ShadowRunner) and runner.records:
            record = runner.records[-1]
            log.info("live=%d shadow(%s)=%d", record.live_replicas, runner.shadow.name, record.shadow_replicas)
        else:
            log.info("desired=%d%s", desired, "" if cpu is None else
                     f" (cpu {cpu.utilisation:.2f} over {cpu.ready_pods} ready, {cpu.unready_pods} unready)")
        return desired

    def run(self, minutes: int | None = None) -> int:
        """Iterate until ``minutes`` decisions were made, the source ends or ``wait`` says stop; returns the
        number of decisions."""
        decisions = 0
        while minutes is None or decisions < minutes:
            try:
                desired = self.step()
            except StopIteration:
                break
            if desired is not None:
                decisions += 1
            if self.wait(self.interval_s):
                break
        return decisions
