"""The autoscaling forecaster trained across two regions on Flower, each on its own shared request series:
a short run beats every region's untrained start on held-back days, and the comparison holds every key the
benchmark reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from regional_scheduler.autoscaling.federated import compare, initial_weights, region_data
from regional_scheduler.autoscaling.request_series import shared_series_paths


def test_a_short_federated_run_beats_each_regions_untrained_start(traces_dir: Path) -> None:
    paths = {p.name.split("_")[0]: p for p in shared_series_paths(traces_dir)}
    regions = [region_data(paths[name], name) for name in ("lora", "twitter")]
    for r in regions:  # held-back rows are disjoint from, and later than, the training rows
        assert len(r.y_train) > 10_000 and len(r.y_test) > 1_000
    comparison, result = compare(regions, rounds=3, steps_per_round=10, strategy="fedprox", proximal_mu=0.01,
                                 finetune_steps=10)
    assert [r.round for r in comparison.rounds] == [1, 2, 3] and comparison.refused_updates == 0
    assert not np.array_equal(result.parameters[0], initial_weights())
    for name, v in comparison.regions.items():
        assert v["federated"] < v["untrained"], name
        assert set(v) >= {"untrained", "local", "federated", "central", "federated_finetuned"}
    assert set(comparison.as_dict()) == {"regions", "totals", "refused_updates", "wall_s", "rounds"}
    assert comparison.as_dict()["rounds"][0]["bytes_to_server"] == 2 * initial_weights().nbytes
