"""The openb validation splits: seed sets shift every run's seeds; the summary against FGD; the
default-mix resampling."""

from __future__ import annotations

from collections import Counter

import pytest

from experiments.validation import (
    N_MIX_PLAIN,
    SEED_SET_STRIDE,
    against_fgd,
    class_pools,
    mix_validation_runs,
    validation_runs,
)
from regional_scheduler.learned.augment import DEFAULT_MIX, pod_class, resampled_pod_list


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


def test_resampled_list_has_the_mix_and_depends_on_the_seed() -> None:
    pools = class_pools(("cpu300", "gpushare80"))
    pods = resampled_pod_list(pools, DEFAULT_MIX, 1)
    assert Counter(pod_class(p) for p in pods) == Counter(DEFAULT_MIX)
    assert len({p.name for p in pods}) == len(pods)  # unique names, as the simulator needs
    assert [p.requests for p in resampled_pod_list(pools, DEFAULT_MIX, 1)] == [p.requests for p in pods]
    assert [p.requests for p in resampled_pod_list(pools, DEFAULT_MIX, 2)] != [p.requests for p in pods]


def test_resampling_a_class_the_pools_lack_is_an_error() -> None:
    pools = class_pools(("cpu0",))  # no CPU-only pod in cpu0
    with pytest.raises(ValueError, match="cpu_only"):
        resampled_pod_list(pools, DEFAULT_MIX, 1)


def test_default_mix_runs_are_plain_then_constrained() -> None:
    rows = mix_validation_runs(["fgd"], runs=[N_MIX_PLAIN - 1, N_MIX_PLAIN])
    assert [r["seed"] for r in rows] == [9000 + N_MIX_PLAIN - 1, 9000 + N_MIX_PLAIN]
    assert rows[0]["share"] == 0.0 and rows[1]["share"] > 0.0
    assert all(80.0 < r["gpu100"] <= 100.0 for r in rows)


def test_training_and_validation_lists_exclude_every_held_out_list() -> None:
    from experiments.validation import LISTS
    from meridian.traces import openb
    from regional_scheduler.learned.augment import TRAINING_LISTS

    names = {p.stem.removeprefix("openb_pod_list_") for p in openb.pod_list_paths()}
    held_out = {n for n in names if n == "default" or n.startswith(("gpuspec", "multigpu"))}
    assert len(held_out) == 9 and set(TRAINING_LISTS) | held_out == names
    assert not held_out & (set(TRAINING_LISTS) | set(LISTS)) and set(LISTS) <= set(TRAINING_LISTS)


def test_spec_like_lists_are_constrained_like_gpuspec33() -> None:
    from meridian.traces import openb
    from regional_scheduler.learned.augment import SPEC_MODEL_SETS, spec_like_pod_list
    from regional_scheduler.learned.features import constrained_share

    nodes = openb.load_nodes()
    pods = openb.load_pods(openb.openb_dir() / "openb_pod_list_cpu0.csv")
    out = spec_like_pod_list(pods, nodes, 6_000_000, 0.30)
    assert out == spec_like_pod_list(pods, nodes, 6_000_000, 0.30)
    assert out != spec_like_pod_list(pods, nodes, 6_000_001, 0.30)
    assert constrained_share(pods) == 0.0 and constrained_share(out) == pytest.approx(0.30, abs=0.03)
    changed = [(a, b) for a, b in zip(pods, out, strict=True) if a != b]
    assert changed and all(a.requests == b.requests and a.requests.gpu_milli_total > 0 for a, b in changed)
    assert all(b.allowed_gpu_models in SPEC_MODEL_SETS[pod_class(b)] for _, b in changed)
    t4 = sum(b.allowed_gpu_models == ("T4",) for _, b in changed) / len(changed)
    assert 0.4 < t4 < 0.65  # about half, as in gpuspec33 (0.54)
    with pytest.raises(ValueError, match="share"):
        spec_like_pod_list(pods, nodes, 1, 1.5)


def test_spec_split_gives_every_list_a_low_and_a_high_share() -> None:
    from experiments.validation import LISTS, spec_share

    for j in range(len(LISTS)):
        assert {spec_share(j, 0), spec_share(j, 1)} <= {round(0.05 + 0.30 * i / 9, 4) for i in range(10)}
        assert spec_share(j, 0) + spec_share(j, 1) == pytest.approx(0.40)
    assert spec_share(0, 0) == 0.05 and spec_share(9, 0) == 0.35
