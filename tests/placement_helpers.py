"""Placing pods one by one through the scheduling framework, for tests of placement policies (not a test
module, so tests import it freely)."""

from __future__ import annotations

from meridian.cluster_state import ClusterState
from meridian.model import Node, Pod
from regional_scheduler.framework import Scheduler


def decide_each(policy, cluster: list[Node], workload: list[Pod], arrivals: list[Pod] | None = None
                ) -> list[int | None]:
    """Prepare ``policy`` on ``workload``, then place ``arrivals`` (default: the workload itself) one by one on a
    fresh state of ``cluster``; the node each went to, None if none."""
    scheduler = Scheduler(policy)
    state = ClusterState.from_nodes(cluster)
    scheduler.prepare(state, workload)
    nodes = []
    for pod in workload if arrivals is None else arrivals:
        placement = scheduler.place(state, pod)
        nodes.append(None if placement is None else placement.node)
        if placement is not None:
            state.allocate(pod, placement)
    return nodes
