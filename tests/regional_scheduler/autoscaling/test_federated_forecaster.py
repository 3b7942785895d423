"""The autoscaling forecaster trained across two regions on Flower, each on its own shared request series:
a short run beats every region's untrained start on held-back days, and the comparison holds every key the
benchmark reports."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from meridian.cli import build_app
from regional_scheduler.autoscaling.federated import compare, initial_weights, region_data, split_regions
from regional_scheduler.autoscaling.request_series import (
    load_request_series,
    shared_series_paths,
    split_requests,
)


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
    assert set(comparison.as_dict()) == {"regions", "totals", "refused_updates", "wall_s", "rounds", "privacy"}
    assert comparison.as_dict()["rounds"][0]["bytes_to_server"] == 2 * initial_weights().nbytes


def test_a_series_shared_among_regions_gives_every_request_to_one_region(series_writer: Callable[..., Path],
                                                                          tmp_path: Path) -> None:
    series = load_request_series(series_writer(tmp_path / "web_events_per_minute.csv", days=3, seed=1,
                                               gap_minutes=(100, 130)))
    parts = split_requests(series, 3, seed=5)
    assert [p.name for p in parts] == [f"{series.name}-{i}" for i in (1, 2, 3)]
    observed = np.isfinite(series.requests_per_minute)
    assert not observed.all()  # the gap is missing in the original, and in every part
    for p in parts:
        assert np.array_equal(np.isfinite(p.requests_per_minute), observed)
    total = np.sum([p.requests_per_minute[observed] for p in parts], axis=0)
    assert np.array_equal(total, np.rint(series.requests_per_minute[observed]))
    shares = [float(np.sum(p.requests_per_minute[observed])) / float(np.sum(total)) for p in parts]
    assert all(0.3 < s < 0.37 for s in shares), shares  # uniformly at random: about a third each
    again = split_requests(series, 3, seed=5)
    assert all(np.array_equal(a.requests_per_minute, b.requests_per_minute, equal_nan=True)
               for a, b in zip(parts, again, strict=True))
    other = split_requests(series, 3, seed=6)
    assert not np.array_equal(parts[0].requests_per_minute, other[0].requests_per_minute, equal_nan=True)


def test_more_regions_than_series_share_each_series(series_writer: Callable[..., Path], tmp_path: Path) -> None:
    paths = [series_writer(tmp_path / f"{name}_events_per_minute.csv", days=4, seed=i)
             for i, name in enumerate(("alpha", "beta"))]
    regions = split_regions(paths, 4)
    assert [r.name for r in regions] == ["alpha-1", "alpha-2", "beta-1", "beta-2"]
    assert len({r.y_train.tobytes() for r in regions}) == 4  # each region its own requests
    assert [r.name for r in split_regions(paths, 3)] == ["alpha-1", "alpha-2", "beta-1"]
    assert [r.name for r in split_regions(paths, 2)] == ["alpha", "beta"]  # one region per series


def test_cli_trains_under_differential_privacy_and_writes_the_lineage(series_writer: Callable[..., Path],
                                                                        tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    for i, name in enumerate(("alpha", "beta")):
        (traces / "requests" / name).mkdir(parents=True)
        series_writer(traces / "requests" / name / f"{name}_events_per_minute.csv", days=4, seed=i)
    out = tmp_path / "fed.npz"
    result = CliRunner().invoke(build_app(), ["train", "federated", "--model", "autoscaling", "--regions", "4", "--rounds", "2",
                                      "--steps-per-round", "5", "--traces", str(traces), "--out", str(out),
                                      "--dp-noise-multiplier", "2", "--dp-clipping-norm", "0.5",
                                      "--dp-noise-seed", "3", "--history-days", "1"])
    assert result.exit_code == 0, result.output
    lineage = json.loads(out.with_suffix(".json").read_text())
    assert lineage["regions"] == ["alpha-1", "alpha-2", "beta-1", "beta-2"] and lineage["kind"] == "federated"
    privacy = lineage["results"]["privacy"]
    assert privacy["rounds"] == 2 and privacy["regions"] == 4 and 0 < privacy["epsilon"] < 20
    assert set(lineage["results"]["regions"]["alpha-1"]) >= {"local", "federated", "central"}
    # One day of history: each region trains on at most a day of minutes (two without the option), and is
    # still tested on its held-back day.
    assert lineage["settings"]["history_days"] == 1
    assert all(0 < v["train_rows"] <= 1440 and v["test_rows"] > 1000 for v in lineage["results"]["regions"].values())
    assert np.load(out)["weights"].shape == initial_weights().shape
    bad = CliRunner().invoke(build_app(), ["train", "federated", "--regions", "2", "--traces", str(traces),
                                   "--dp-noise-multiplier", "1", "--dp-clipping-norm", "0"])
    assert bad.exit_code != 0 and "clipping_norm" in bad.output


def test_secure_aggregation_gives_fedavgs_model_without_the_server_seeing_a_region(
        series_writer: Callable[..., Path], tmp_path: Path) -> None:
    paths = [series_writer(tmp_path / f"{name}_events_per_minute.csv", days=4, seed=i)
             for i, name in enumerate(("alpha", "beta", "gamma"))]
    regions = [region_data(p, p.name.split("_")[0]) for p in paths]
    plain, _ = compare(regions, rounds=2, steps_per_round=5, finetune_steps=1)
    secure, result = compare(regions, rounds=2, steps_per_round=5, finetune_steps=1, secure_aggregation=True)
    for name in plain.regions:  # the same model up to SecAgg+'s quantisation
        assert secure.regions[name]["federated"] == pytest.approx(plain.regions[name]["federated"], rel=1e-4)
    # What SecAgg+ moves (keys, shares, masked vectors) is far more than the weights alone.
    assert result.rounds[-1].bytes_to_server > 3 * initial_weights().nbytes
    with pytest.raises(ValueError, match="secure aggregation"):
        compare(regions, rounds=1, strategy="fedprox", secure_aggregation=True)
