"""Reconciliation: what the store says is dispatched, against what each cluster reports holding.

The router makes an attempt durable before it publishes the dispatch, so a restart never dispatches
twice; a crash between the two leaves a workload ``DISPATCHED`` with no place message anywhere, and a
restart only requeues ``PENDING`` ones. A lost event (the cluster placed it, the news never arrived)
leaves the same picture. The scheduler's ``reconciler`` worker therefore looks at every ``DISPATCHED``
workload on start (once the summary backlog is read) and every ``reconcile.interval_s``, and
:func:`decide` says what to do with each:

==========================================================  =========================================
the cluster it was dispatched to                              verdict
==========================================================  =========================================
never heard of since this scheduler started, though every     reroute (``cluster_unknown``)
cluster could have been heard for a whole cluster timeout
known but down (silent, or no schedulable node), dispatched   reroute (``cluster_down``)
at least ``grace_s`` ago
up, and its latest summary lists all it holds and was made    publish the same place again:
at least ``grace_s`` after the dispatch                       ``place_lost`` if it is not held there,
                                                              ``event_lost`` if it is
anything else (too early, or holdings not reported)           nothing yet
==========================================================  =========================================

Publishing the *same* attempt again is safe because the regional worker applies a ``(workload,
attempt)`` once: a place it never saw is placed, one it applied makes it re-send the workload's current
event (``SCHEDULED``/``RUNNING`` with its nodes, or ``FAILED``), and the global side ignores news it
already has. "Dispatched" is when this scheduler last published the place, or its own start for a
workload it restored from the store (it cannot know whether the previous run published it).

Hazards: a re-published place may overtake a reroute decided at the same moment elsewhere (a
failover, a rejection); the regional worker then holds a stale attempt until the release that the
reroute sends frees it, and the global tier ignores that attempt's events. Only ``DISPATCHED``
workloads are reconciled: a ``RUNNING`` one missing from its cluster (a simulated cluster's worker
restarted and forgot it) is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from global_scheduler.registry import HoldingsView

REPUBLISH = "republish"
REROUTE = "reroute"


@dataclass(frozen=True)
class Verdict:
    action: str  # REPUBLISH or REROUTE
    reason: str  # a short class for the metric label: place_lost, event_lost, cluster_down, cluster_unknown


def decide(*, workload_id: str, view: HoldingsView | None, dispatched_s: float, now_s: float, grace_s: float,
           heard_window_s: float, cluster_timeout_s: float) -> Verdict | None:
    """What to do with one ``DISPATCHED`` workload; None: nothing (yet).

    ``view``: its cluster's latest summary (None: never heard of); ``dispatched_s``: when its place was
    last published (unix s); ``heard_window_s``: how long every cluster could have been heard from (since
    this scheduler started and the bus was last readable).
    """
    if now_s - dispatched_s < grace_s:
        return None
    if view is None:
        return Verdict(REROUTE, "cluster_unknown") if heard_window_s > cluster_timeout_s else None
    if not view.ready:
        return Verdict(REROUTE, "cluster_down")
    if view.workloads is None or view.generated_s < dispatched_s + grace_s:
        return None
    return Verdict(REPUBLISH, "event_lost" if workload_id in view.workloads else "place_lost")
