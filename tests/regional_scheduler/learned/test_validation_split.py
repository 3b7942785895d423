"""The openb validation split: seed sets shift every run's seeds; the summary against FGD."""

from __future__ import annotations

from regional_scheduler.learned.validation import SEED_SET_STRIDE, against_fgd, validation_runs


def test_seed_sets_shift_the_runs_seeds() -> None:
    rows = validation_runs(["fgd"], n=1, seed_sets=2)
    assert [r["seed"] for r in rows] == [5000, 5000 + SEED_SET_STRIDE]
    assert rows[0]["list"] == rows[1]["list"]
    # Another augmentation and another inflation: a different run, not a repeat.
    assert rows[0]["share"] != rows[1]["share"] and rows[0]["gpu100"] != rows[1]["gpu100"]


def test_against_fgd_pairs_runs_by_seed() -> None:
    rows = [{"seed": s, "policy": p, "gpu100": v} for s, p, v in (
        (1, "fgd", 90.0), (1, "learned", 91.0), (2, "fgd", 80.0), (2, "learned", 79.5), (3, "learned", 99.0))]
    summary = against_fgd(rows, "learned")
    assert summary == {"mean_delta": 0.25, "worst_delta": -0.5, "runs_at_least_fgd": 1, "runs": 2}
    assert against_fgd(rows, "nope") == {}
