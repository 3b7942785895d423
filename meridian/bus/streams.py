"""Stream and key names of the fabric, in one place.

One stream per purpose and cluster. A dead-letter stream sits beside every stream it serves:
``<stream>:dead``. Cluster names are restricted to what a Kubernetes name allows (plus ``_`` and
``.``) so a name can never smuggle a ``:`` into another cluster's key space.
"""

from __future__ import annotations

import re

PREFIX = "meridian"
SUMMARY_STREAM = f"{PREFIX}:summary"
#: Every workload the global tier moves off a cluster (failover, failback, rejection, reconciliation) and
#: every stale copy it releases: ``WorkloadMove`` records, for operators and audits.
MOVES_STREAM = f"{PREFIX}:moves"
DEAD_LETTER_SUFFIX = ":dead"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def _checked(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"invalid {kind} name {name!r}: letters, digits, '.', '_' and '-' only, at most 253")
    return name


def telemetry_stream(cluster: str) -> str:
    """Node reports (``NodeTelemetry``) of one cluster's agents."""
    return f"{PREFIX}:telemetry:{_checked('cluster', cluster)}"


def dispatch_stream(cluster: str) -> str:
    """Workloads the global tier routed to one cluster."""
    return f"{PREFIX}:dispatch:{_checked('cluster', cluster)}"


def events_stream(cluster: str) -> str:
    """Scheduling events of one cluster (bindings, failures, evictions)."""
    return f"{PREFIX}:events:{_checked('cluster', cluster)}"


def dead_letter_stream(stream: str) -> str:
    """Where consumers of ``stream`` park the messages they could not use, with the reason."""
    return f"{stream}{DEAD_LETTER_SUFFIX}"


def carbon_key(zone: str) -> str:
    """A string key holding the current grid intensity of a zone in gCO2/kWh, kept by a feeder."""
    return f"{PREFIX}:carbon:{_checked('zone', zone)}"
