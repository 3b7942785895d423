"""Stream and key names of the fabric, in one place.

One stream per purpose and cluster. A dead-letter stream sits beside every stream it serves:
``<stream>:dead``. Cluster names are restricted to what a Kubernetes name allows (plus ``_`` and
``.``) so a name can never smuggle a ``:`` or a ``{`` into another cluster's key space.

Redis Cluster (docs/redis-cluster.md, "Key layout"): a cluster's streams carry its name as the hash tag,
``meridian:{<cluster>}:telemetry``, so one member cluster's telemetry, dispatch and events streams and
their dead letters live in one slot, and the unit a Redis Cluster spreads over its primaries is a member
cluster (one cluster's 10,000 nodes every 2 s are 5,000 entries/s, a fraction of one primary). Nothing
reads two streams in one command, so no command crosses slots. The global tier's single streams
(summaries, moves) are their own slots; the workload store splits its records over
:func:`workload_bucket` keys.
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
    return f"{PREFIX}:{{{_checked('cluster', cluster)}}}:telemetry"


def dispatch_stream(cluster: str) -> str:
    """Workloads the global tier routed to one cluster."""
    return f"{PREFIX}:{{{_checked('cluster', cluster)}}}:dispatch"


def events_stream(cluster: str) -> str:
    """Scheduling events of one cluster (bindings, failures, evictions)."""
    return f"{PREFIX}:{{{_checked('cluster', cluster)}}}:events"


def workload_bucket(index: int) -> str:
    """One of the hashes the global tier's accepted workloads are split over (``global_scheduler.store``), each
    its own hash tag so a Redis Cluster spreads them over its primaries."""
    if index < 0:
        raise ValueError(f"workload bucket index must be >= 0, not {index}")
    return f"{PREFIX}:workloads:{{b{index:03d}}}"


def dead_letter_stream(stream: str) -> str:
    """Where consumers of ``stream`` park the messages they could not use, with the reason."""
    return f"{stream}{DEAD_LETTER_SUFFIX}"


def carbon_key(zone: str) -> str:
    """A string key holding the current grid intensity of a zone in gCO2/kWh, kept by a feeder."""
    return f"{PREFIX}:carbon:{_checked('zone', zone)}"
