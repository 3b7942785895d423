"""The autoscaling forecaster distilled from an MLP teacher into the served linear model: the student is at
most a tenth of the teacher's size, distillation moves it towards the teacher, held-back rows never shape
any weights, and the benchmark command writes every figure it promises."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from meridian.cli import build_app
from regional_scheduler.autoscaling.distillation import (
    MODELS,
    DistillationConfig,
    Fitted,
    LinearForecaster,
    SeriesRows,
    fit_all,
    parameter_count,
    serialised_bytes,
    series_rows,
    teacher_distance,
)
from regional_scheduler.autoscaling.federated import initial_weights
from regional_scheduler.autoscaling.request_series import shared_series_paths
from regional_scheduler.autoscaling.scenario import build_scenario

CONFIG = DistillationConfig(teacher_steps=150, student_steps=150, calibrate=False)


@pytest.fixture(scope="module")
def lora_rows() -> SeriesRows:
    from meridian.traces import locate_traces

    path = next(p for p in shared_series_paths(locate_traces().path) if p.name.startswith("lora"))
    return series_rows(build_scenario(path), "lora")


@pytest.fixture(scope="module")
def fitted(lora_rows: SeriesRows) -> Fitted:
    return fit_all(lora_rows, CONFIG)


def test_the_student_is_at_most_a_tenth_of_the_teacher(fitted: Fitted) -> None:
    teacher, student = parameter_count(fitted.teacher), parameter_count(fitted.student)
    assert student == parameter_count(fitted.student_direct)
    assert student <= teacher / 10
    # The .npz's per-array headers (a few hundred bytes each) weigh more on the small model.
    assert serialised_bytes(fitted.student) < serialised_bytes(fitted.teacher) / 5


def test_the_distilled_student_tracks_the_teacher_better_than_its_untrained_start(lora_rows: SeriesRows,
                                                                                  fitted: Fitted) -> None:
    x = lora_rows.x_test
    untrained = teacher_distance(LinearForecaster(initial_weights()), fitted.teacher, x)
    distilled = teacher_distance(fitted.student, fitted.teacher, x)
    assert distilled < 0.5 * untrained, (distilled, untrained)


def test_held_back_rows_never_enter_training(lora_rows: SeriesRows, fitted: Fitted) -> None:
    rng = np.random.default_rng(1)
    x, y = lora_rows.x.copy(), lora_rows.y.copy()
    x[lora_rows.test] = rng.uniform(0.0, 5.0, (int(lora_rows.test.sum()), x.shape[1]))
    y[lora_rows.test] = rng.uniform(0.0, 5.0, int(lora_rows.test.sum()))
    changed = fit_all(replace(lora_rows, x=x, y=y), CONFIG)
    for name in MODELS:
        before, after = getattr(fitted, name).arrays(), getattr(changed, name).arrays()
        assert before.keys() == after.keys()
        for key in before:
            assert np.array_equal(before[key], after[key]), (name, key)


def test_bench_distillation_writes_every_figure(tmp_path: Path, series_writer: Callable[..., Path]) -> None:
    traces = tmp_path / "traces"
    (traces / "requests" / "synthetic").mkdir(parents=True)
    series_writer(traces / "requests" / "synthetic" / "synthetic_events_per_minute.csv", days=4)
    out = tmp_path / "distillation.json"
    result = CliRunner().invoke(build_app(), ["bench", "distillation", "--series", "synthetic", "--traces",
                                              str(traces), "--teacher-steps", "20", "--student-steps", "20",
                                              "--fixed-levels", "--json", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    keys = {"params", "bytes", "p99_ms", "pinball", "violation_minutes", "replica_minutes"}
    for name in ("teacher", "student", "student_direct"):
        assert set(summary[name]) >= keys
        assert set(summary["series"]["synthetic"][name]) >= keys
        assert summary[name]["p99_ms"] > 0
    assert summary["ratio"]["params"] <= 0.1
    assert "violation_minutes_gap_pct" in summary["ratio"]
