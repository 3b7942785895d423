"""``explain``: the chosen node is the scheduler's choice; attributions name real features."""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import Pod, Resources
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned.explain import explain
from regional_scheduler.learned.features import NODE_FEATURES
from regional_scheduler.learned.serving import LearnedScorer, ServingSettings
from regional_scheduler.policies.learned import LearnedPolicy


def test_explanation_matches_the_decision(untrained_nets, small_gpu_cluster, small_workload) -> None:
    scorer = LearnedScorer(untrained_nets)
    # A generous budget: on a busy test machine a cold first decision must not fall back to FGD.
    scheduler = Scheduler(LearnedPolicy(ServingSettings(budget_ms=60_000), scorer=scorer))
    state = ClusterState.from_nodes(small_gpu_cluster)
    scheduler.prepare(state, small_workload)
    pod = small_workload[0]
    placement = scheduler.place(state, pod)
    result = explain(scorer, state, pod, top=3)
    assert placement is not None and result.chosen == state.names[placement.node]
    assert [n.rank for n in result.nodes] == [1, 2, 3]
    assert result.nodes[0].score >= result.nodes[1].score >= result.nodes[2].score
    for node in result.nodes:
        assert len(node.top_features) == 5
        assert all(name in NODE_FEATURES and np.isfinite(a) for name, _, a in node.top_features)
    assert result.as_dict()["chosen"] == result.chosen


def test_no_feasible_node_is_explained_by_the_filter(untrained_nets, small_gpu_cluster, small_workload) -> None:
    scorer = LearnedScorer(untrained_nets)
    state = ClusterState.from_nodes(small_gpu_cluster)
    scorer.prepare(state, small_workload)
    huge = Pod(name="huge", requests=Resources(milli_cpu=1_000_000))
    result = explain(scorer, state, huge)
    assert result.chosen is None and result.n_feasible == 0
    assert result.rejected_by["NodeResourcesFit"] == len(small_gpu_cluster)


def test_explain_does_not_depend_on_machine_load(tmp_path, monkeypatch) -> None:
    # Every decision made to look 10 ms slow (a loaded machine): the replay of the earlier pods must
    # still be the model's, so the explained state and choice are the same as on a quiet machine.
    import json

    from typer.testing import CliRunner

    from meridian.cli import build_app
    from regional_scheduler.policies import learned as learned_plugin

    def run(name: str) -> dict:
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(build_app(), ["explain", "--scenario", "seed-50x200", "--seed", "3",
                                                  "--pod-index", "120", "--json", str(out)])
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text())

    quiet = run("quiet")
    clock = iter(range(10**9))
    monkeypatch.setattr(learned_plugin.time, "perf_counter", lambda: next(clock) * 0.010)
    loaded = run("loaded")
    assert loaded["chosen"] == quiet["chosen"]
    assert [n["node"] for n in loaded["nodes"]] == [n["node"] for n in quiet["nodes"]]
