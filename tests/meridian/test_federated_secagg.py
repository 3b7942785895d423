"""Federated averaging under Flower's SecAgg+ (:mod:`meridian.federated.secagg`) with toy regional tasks: the
secure aggregate is FedAvg's up to SecAgg+'s quantisation, the server never holds a region's update in the
clear, and settings SecAgg+ cannot run with are refused before anything starts."""

from __future__ import annotations

import numpy as np
import pytest

from meridian.federated.secagg import LoopbackGrid, SecAggSettings, _to_wire, run_secure_federated
from tests.federated_helpers import JumpTask, LinearTask

CLIP, LEVELS, MAX_WEIGHT = 8.0, 2**22, 1000.0


def _tasks() -> dict[str, object]:
    # Different example counts (200, 50, 600), so that a wrong weighting of the average would show.
    return {"north": LinearTask(1, 0.0), "south": JumpTask([1.0, 2.0, -3.0], 50),
            "west": JumpTask([-0.5, 0.25, 2.0], 600)}


def _last_updates(sent: dict[str, list[tuple[str, object]]]) -> dict[str, tuple[np.ndarray, int]]:
    out = {}
    for region, replies in sent.items():
        arrays, n, _ = [body for kind, body in replies if kind == "fit"][-1]
        out[region] = (arrays[0], n)
    return out


@pytest.fixture(scope="module")
def secure_run() -> tuple[object, LoopbackGrid]:
    grids: list[LoopbackGrid] = []
    result = run_secure_federated(_tasks(), rounds=2, seed=0, clipping_range=CLIP, quantization_range=LEVELS,
                                  max_weight=MAX_WEIGHT, grid_out=grids)
    return result, grids[0]


def test_the_secure_aggregate_is_fedavg_up_to_quantisation(secure_run) -> None:
    result, _ = secure_run
    updates = _last_updates(result.sent)
    total = sum(n for _, n in updates.values())
    fedavg = sum(w * n for w, n in updates.values()) / total
    # Each region's weighted update is off by less than one quantisation level; the sum of the weights
    # divides the total error.
    step = SecAggSettings(3, 2, CLIP, LEVELS, MAX_WEIGHT).quantisation_step()
    bound = len(updates) * step / (total / MAX_WEIGHT) + 1e-9
    error = np.abs(result.parameters[0] - fedavg).max()
    assert error <= bound, (error, bound)
    # The unweighted mean is far off: the check tells the two apart.
    assert np.abs(np.mean([w for w, _ in updates.values()], axis=0) - fedavg).max() > 100 * bound
    assert [r.round for r in result.rounds] == [1, 2]
    for r in result.rounds:
        assert r.wall_s > 0 and r.bytes_to_server > 0 and r.bytes_from_server > 0 and r.loss is not None
    for replies in result.sent.values():
        assert [kind for kind, _ in replies].count("fit") == 2


def test_the_server_never_receives_a_region_update_in_the_clear(secure_run) -> None:
    result, grid = secure_run
    assert grid.received and not grid.client_errors
    updates = _last_updates(result.sent)
    masked: dict[str, list[np.ndarray]] = {}
    for region, reply in grid.received:
        assert all(len(record) == 0 for record in reply.content.array_records.values()), region
        if reply.metadata.group_id == "2":  # the round whose updates _last_updates holds
            configs = reply.content.config_records.get("secaggplus_configs", {})
            if "masked_params" in configs:
                from flwr.common import bytes_to_ndarray

                masked[region] = [bytes_to_ndarray(b) for b in configs["masked_params"]]
    assert sorted(masked) == sorted(updates)  # every region sent a masked vector in that round
    wire = b"".join(_to_wire(reply) for _, reply in grid.received)
    for region, (w, n) in updates.items():
        assert w.tobytes() not in wire, region  # the float update itself never travels
        # What the region would send without masks: its weight and its weighted update on SecAgg+'s levels.
        q_ratio = round(n / MAX_WEIGHT * LEVELS)
        plain = (np.clip(w * q_ratio / LEVELS, -CLIP, CLIP) + CLIP) * LEVELS / (2 * CLIP)
        weight, vector = masked[region]
        assert weight.shape == (1,) and abs(int(weight[0]) - q_ratio) > 1, region
        assert np.all(np.abs(vector.astype(float) - plain) > 1.0), (region, vector, plain)


@pytest.mark.parametrize(("kwargs", "regions", "match"), [
    ({"num_shares": 3, "reconstruction_threshold": 4}, 3, "reconstruction_threshold must be at least 2 and below"),
    ({"num_shares": 3, "reconstruction_threshold": 3}, 3, "reconstruction_threshold must be at least 2 and below"),
    ({"num_shares": 5}, 3, r"num_shares must be between 3 and the number of regions \(3\)"),
    ({}, 2, "at least 3 regions"),
    ({"quantization_range": 2**31}, 3, "quantization_range must be positive and below"),
    ({"clipping_range": 0.0}, 3, "clipping_range must be positive"),
])
def test_settings_secagg_cannot_run_with_are_refused(kwargs: dict[str, object], regions: int, match: str) -> None:
    tasks = {f"r{i}": LinearTask(i, 0.0) for i in range(regions)}
    with pytest.raises(ValueError, match=match):
        run_secure_federated(tasks, rounds=1, **kwargs)


def test_an_update_secagg_would_clip_stays_in_its_region() -> None:
    tasks = {"north": LinearTask(1, 0.0), "south": LinearTask(2, 0.3), "huge": JumpTask([100.0, 0.0, 0.0], 500)}
    with pytest.raises(RuntimeError, match=r"huge fit: update × examples/max_weight reaches 50"):
        run_secure_federated(tasks, rounds=1)
