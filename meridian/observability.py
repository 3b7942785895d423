"""Prometheus metrics for every Meridian component: one registry convention, shared definitions.

Conventions (https://prometheus.io/docs/practices/naming/), checked for every ``meridian_*`` metric
in the registry by ``tests/meridian/test_observability.py`` through :func:`naming_problems`:

* the application prefix ``meridian_``, then snake_case;
* base units as a plural suffix: ``_seconds``, ``_bytes``, ``_joules``, ``_watts``, ``_grams``,
  ``_euros`` (never milliseconds, kWh or kilograms: dashboards scale, metrics do not);
* counters end in ``_total`` (after the unit: ``meridian_region_energy_joules_total``), other types
  never do;
* label names are snake_case, not reserved (``le``, ``quantile``, ``job``, ``instance``) and never
  carry unbounded values
  (a dead-letter ``reason`` label is a short class such as ``decode`` or ``oversized``, not the text
  of the error; the text goes to the dead-letter stream).

Registry convention: components define metrics through :func:`counter`, :func:`gauge` and
:func:`histogram` here, which are get-or-create on one registry (the process-wide
``prometheus_client.REGISTRY`` by default), so two modules (or a test importing a module twice) that
declare the same metric share it instead of failing with "Duplicated timeseries". A second
declaration with a different type or label set is a programming error and raises.

Each component serves the registry with :func:`start_metrics_server` (``/metrics`` on the port of
:class:`MetricsSettings`).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "meridian_"

# Base units Meridian exposes, and the scaled or non-base spellings a name must not use instead.
BASE_UNITS = ("seconds", "bytes", "joules", "watts", "grams", "euros", "ratio", "cores", "info")
FORBIDDEN_UNIT_WORDS = {
    "ms": "seconds", "milliseconds": "seconds", "microseconds": "seconds", "minutes": "seconds",
    "hours": "seconds", "kb": "bytes", "kilobytes": "bytes", "mb": "bytes", "megabytes": "bytes",
    "mib": "bytes", "gib": "bytes", "kwh": "joules", "wh": "joules", "kilojoules": "joules",
    "kilowatts": "watts", "kw": "watts", "kg": "grams", "kilograms": "grams", "tonnes": "grams",
    "percent": "ratio", "millicores": "cores",
}
# A name that mentions one of these quantities must carry its unit.
QUANTITY_UNITS = {"energy": "joules", "carbon": "grams", "power": "watts", "cost": "euros",
                  "latency": "seconds", "duration": "seconds"}
_NAME_RE = re.compile(r"^meridian_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_RESERVED_LABELS = {"le", "quantile", "job", "instance"}


def naming_problems(name: str, kind: str, labelnames: Sequence[str] = ()) -> list[str]:
    """What is wrong with a metric's exposed name and labels (empty when it follows the conventions).

    ``name`` is the name as exposed (a counter's includes ``_total``); ``kind`` is ``counter``,
    ``gauge``, ``histogram``, ``summary`` or ``info``.
    """
    problems: list[str] = []
    if not _NAME_RE.match(name):
        problems.append(f"{name}: must be meridian_ followed by snake_case words")
    words = name.removeprefix(PREFIX).split("_")
    if kind == "counter" and not name.endswith("_total"):
        problems.append(f"{name}: a counter must end in _total")
    if kind != "counter" and name.endswith("_total"):
        problems.append(f"{name}: only counters end in _total")
    for word in words:
        if word in FORBIDDEN_UNIT_WORDS:
            problems.append(f"{name}: use the base unit {FORBIDDEN_UNIT_WORDS[word]!r}, not {word!r}")
    # A quantity needs a unit; the unit need not be the quantity's own (energy_cost_euros is money).
    if not any(w in BASE_UNITS for w in words):
        for quantity, unit in QUANTITY_UNITS.items():
            if quantity in words:
                problems.append(f"{name}: a {quantity} metric must carry its unit suffix _{unit}")
    for label in labelnames:
        if not _LABEL_RE.match(label):
            problems.append(f"{name}: label {label!r} must be snake_case")
        if label in _RESERVED_LABELS:
            problems.append(f"{name}: label {label!r} is reserved by Prometheus")
    return problems


_lock = threading.Lock()
_declared: dict[tuple[int, str], MetricWrapperBase] = {}


def _get_or_create(cls: type[MetricWrapperBase], name: str, documentation: str, labelnames: Sequence[str],
                   registry: CollectorRegistry, **kwargs: object) -> MetricWrapperBase:
    key = (id(registry), name)
    with _lock:
        existing = _declared.get(key)
        if existing is not None:
            if type(existing) is not cls or tuple(existing._labelnames) != tuple(labelnames):
                raise ValueError(f"metric {name} is already declared as {type(existing).__name__}"
                                 f"{tuple(existing._labelnames)}")
            return existing
        metric = cls(name, documentation, labelnames=tuple(labelnames), registry=registry, **kwargs)
        _declared[key] = metric
        return metric


def counter(name: str, documentation: str, labelnames: Sequence[str] = (), *,
            registry: CollectorRegistry = REGISTRY) -> Counter:
    """A counter (``name`` ends in ``_total``), shared with any earlier declaration of it."""
    return _get_or_create(Counter, name, documentation, labelnames, registry)  # type: ignore[return-value]


def gauge(name: str, documentation: str, labelnames: Sequence[str] = (), *,
          registry: CollectorRegistry = REGISTRY) -> Gauge:
    return _get_or_create(Gauge, name, documentation, labelnames, registry)  # type: ignore[return-value]


# Decisions take 0.1-2 ms when all is well; the buckets resolve that range and still catch timeouts.
DECISION_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def histogram(name: str, documentation: str, labelnames: Sequence[str] = (), *,
              buckets: Sequence[float] = DECISION_BUCKETS_S, registry: CollectorRegistry = REGISTRY) -> Histogram:
    return _get_or_create(Histogram, name, documentation, labelnames, registry,  # type: ignore[return-value]
                          buckets=tuple(buckets))


# ---- shared definitions: import these rather than declaring look-alikes --------------------------

PLACEMENTS = counter("meridian_placements_total", "Pods placed on a node (regional) or workloads routed to a "
                     "cluster (global).", ["component", "cluster", "policy"])
PLACEMENT_FAILURES = counter("meridian_placement_failures_total", "Placements or routings that found no "
                             "feasible target, by the constraint that failed.", ["component", "cluster", "reason"])
POLICY_FALLBACKS = counter("meridian_policy_fallbacks_total", "Decisions taken by the fallback heuristic because "
                           "the learned policy failed, timed out or had no checkpoint.",
                           ["component", "policy", "reason"])
DECISION_LATENCY = histogram("meridian_decision_latency_seconds", "Wall time of one placement or routing "
                             "decision.", ["component", "policy"])
RECONCILIATIONS = counter("meridian_reconciliations_total", "Dispatched workloads the global scheduler's "
                          "reconciliation acted on: published again to their cluster (action republish) or "
                          "rerouted (action reroute), by a short reason class.", ["action", "reason"])
WORKLOAD_MOVES = counter("meridian_workload_moves_total", "Workloads moved off a cluster (kind failover, failback, "
                         "rejected, reconciliation) and stale copies released on one (kind stale_copy); each is "
                         "also a WorkloadMove on meridian:moves.", ["kind", "cluster"])
DISPATCH_LAG = histogram("meridian_dispatch_lag_seconds", "Time from a workload's acceptance by the global API "
                         "to its dispatch to a cluster (a reroute counts again, from the acceptance).", ["policy"],
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0))
STREAM_LAG = gauge("meridian_stream_lag_entries", "Entries in a stream not yet delivered to the consumer group.",
                   ["stream", "group"])
STREAM_PENDING = gauge("meridian_stream_pending_entries", "Entries delivered to a consumer group but not yet "
                       "acknowledged.", ["stream", "group"])
STREAM_DEAD_LETTERS = counter("meridian_stream_dead_letters_total", "Malformed or oversized messages parked on a "
                              "dead-letter stream, by a short reason class.", ["stream", "reason"])

REGION_ENERGY = counter("meridian_region_energy_joules_total", "IT energy drawn by the nodes of a region, as "
                        "measured (RAPL) or modelled.", ["region"])
REGION_FACILITY_ENERGY = counter("meridian_region_facility_energy_joules_total", "IT energy times the site's PUE: "
                                 "what the grid delivered.", ["region"])
REGION_CARBON = counter("meridian_region_carbon_grams_total", "CO2-equivalent emitted for the region's facility "
                        "energy at the grid intensity of each interval.", ["region"])
# A gauge, not a counter: day-ahead prices go negative, so cumulative cost can fall, and a counter
# that decreases is read by rate() as a reset.
REGION_COST = gauge("meridian_region_energy_cost_euros", "Cumulative cost of the region's facility energy at "
                    "each interval's day-ahead price since the process started.", ["region"])
CLUSTER_POWER = gauge("meridian_cluster_power_watts", "Latest IT power of a cluster (sum over its nodes).",
                      ["region", "cluster"])
ENERGY_UNKNOWN = counter("meridian_energy_unknown_seconds_total", "Time in telemetry gaps whose energy was not "
                         "interpolated (see meridian.energy).", ["region", "cluster"])
ACCOUNTING_RECORDS = counter("meridian_accounting_records_total", "Energy records seen by the accounting "
                             "consumer, by outcome (applied, duplicate, invalid).", ["outcome"])
ACCOUNTING_INVALID_NAMES = counter("meridian_accounting_invalid_names_total", "Energy shares whose tenant or "
                                   "workload name could not key the ledger, kept as (invalid-name).")


def record_region_energy(region: str, *, it_energy_joules: float, facility_energy_joules: float,
                         carbon_grams: float, cost: float) -> None:
    """Add one interval's accounting of a region to the energy counters."""
    REGION_ENERGY.labels(region=region).inc(max(it_energy_joules, 0.0))
    REGION_FACILITY_ENERGY.labels(region=region).inc(max(facility_energy_joules, 0.0))
    REGION_CARBON.labels(region=region).inc(max(carbon_grams, 0.0))
    REGION_COST.labels(region=region).inc(cost)


def default_bind_address() -> str:
    """``0.0.0.0`` inside a Kubernetes pod (the kubelet sets ``KUBERNETES_SERVICE_HOST``), else ``127.0.0.1``.

    Health and metrics endpoints answer without credentials; outside a pod nothing but the host
    itself should reach them unless the operator says otherwise."""
    return "0.0.0.0" if os.environ.get("KUBERNETES_SERVICE_HOST") else "127.0.0.1"


class MetricsSettings(BaseSettings):
    """Where a component serves ``/metrics`` (environment: ``MERIDIAN_METRICS_*``)."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_METRICS_")

    enabled: bool = Field(True, description="Serve /metrics at all.")
    port: int = Field(9464, ge=0, le=65535, description="TCP port; 9464 is the conventional Prometheus "
                      "exporter port of OpenTelemetry SDKs and clashes with no Kubernetes component. 0 picks a "
                      "free port (tests).")
    address: str = Field(default_factory=default_bind_address, description="Bind address. Default: all "
                         "interfaces inside a Kubernetes pod (so the pod IP is scraped), loopback anywhere else "
                         "(a laptop or VM does not publish its metrics to the network unasked).")


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``port`` is the bound port (useful when 0 was asked for)."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics_server(settings: MetricsSettings | None = None, *, registry: CollectorRegistry = REGISTRY,
                         port_setting: str = "MERIDIAN_METRICS_PORT") -> MetricsServer | None:
    """Serve ``registry`` over HTTP in a daemon thread; ``None`` when metrics are disabled. A port that
    cannot be bound (in use, an address not this machine's) is a :class:`~meridian.errors.UserError`
    naming it and ``port_setting``, the option or variable that chooses another."""
    settings = settings or MetricsSettings()
    if not settings.enabled:
        return None
    try:
        server, thread = start_http_server(settings.port, addr=settings.address, registry=registry)
    except OSError as exc:
        from meridian.errors import bind_error

        raise bind_error(exc, what="the metrics", host=settings.address, port=settings.port,
                         setting=port_setting) from exc
    return MetricsServer(server, thread)
