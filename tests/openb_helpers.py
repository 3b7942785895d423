"""Small openb slices shared by the learned-policy tests and the experiments' tests."""

from __future__ import annotations

from meridian.model import Node, Pod
from meridian.traces import openb
from regional_scheduler.learned.augment import augmented_pod_list


def openb_slice(every: int, pod_list: str, *, seed: int, count: int,
                augment_seed: int | None = None) -> tuple[list[Node], list[Pod], list[Pod]]:
    """Every ``every``-th openb node, a shared pod list (GPU-model-constrained with ``augment_seed``)
    and the first ``count`` pods of it inflated to those nodes' GPU capacity: nodes, list, arrivals."""
    nodes = openb.load_nodes()[::every]
    pods = openb.load_pods(openb.openb_dir() / f"openb_pod_list_{pod_list}.csv")
    if augment_seed is not None:
        pods, _ = augmented_pod_list(pods, nodes, augment_seed, p_augment=1.0)
    arrivals = openb.inflate_pods(pods, sum(n.allocatable_resources.gpu for n in nodes) * 1000, seed=seed)
    return nodes, pods, arrivals[:count]
