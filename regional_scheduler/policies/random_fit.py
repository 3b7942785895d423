"""``random``: every feasible node scores the same; the scheduler's random tie-break picks one.

The FGD paper's Random baseline (simulator ``random_score.go``).
"""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from regional_scheduler.policies.base import ChoosesTieBreak, Scores, TieBreak

NAME = "random"


class RandomPolicy(ChoosesTieBreak):
    name = NAME
    tie_break: TieBreak = "random"

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        return Scores(np.zeros(nodes.size))


def build() -> RandomPolicy:
    return RandomPolicy()
