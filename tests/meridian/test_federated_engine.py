"""The federated engine on Flower (real server and clients over gRPC on loopback) with toy regional tasks:
what crosses a region's boundary, determinism for a seed, and refusal of updates of the wrong shapes."""

from __future__ import annotations

import numpy as np
import pytest

from meridian.federated.engine import BoundaryError, BoundaryGuard, run_federated, shape_checked
from tests.federated_helpers import LinearTask


def _tasks() -> dict[str, LinearTask]:
    return {"north": LinearTask(1, 0.0), "south": LinearTask(2, 0.3), "west": LinearTask(3, -0.3)}


def test_only_parameters_and_declared_metrics_leave_a_region_and_the_model_learns() -> None:
    tasks = _tasks()
    result = run_federated(tasks, rounds=3, strategy="fedprox", proximal_mu=0.01, seed=0)
    assert [r.round for r in result.rounds] == [1, 2, 3] and not result.refused_updates
    for region, sent in result.sent.items():
        kinds = [kind for kind, _ in sent]
        assert kinds.count("fit") == 3 and kinds.count("evaluate") == 3, (region, kinds)
        for kind, body in sent:
            assert kind in ("parameters", "fit", "evaluate")
            if kind == "fit":
                arrays, n, metrics = body
                assert [a.shape for a in arrays] == [(3,)] and n == 200 and set(metrics) <= {"train_loss"}
            if kind == "evaluate":
                loss, n, metrics = body
                assert isinstance(loss, float) and metrics == {}
    w = result.parameters[0]
    for task in tasks.values():
        assert task.loss(w) < 0.2 * task.loss(np.zeros(3))  # far better than the untrained start
    assert result.rounds[0].bytes_to_server == 3 * 3 * 8


def test_the_same_seed_gives_the_same_model() -> None:
    first = run_federated(_tasks(), rounds=2, seed=7).parameters[0]
    second = run_federated(_tasks(), rounds=2, seed=7).parameters[0]
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize(("call", "match"), [
    (lambda g: g.fit_result([np.zeros(3)], 5, {"rows": 1.0}), "undeclared metrics"),
    (lambda g: g.fit_result([np.zeros(3)], 5, {"train_loss": "raw rows"}), "not a number"),
    (lambda g: g.fit_result([np.zeros(4)], 5, {}), r"expected float\(3,\)"),
    (lambda g: g.fit_result([np.array(["a", "b", "c"])], 5, {}), "expected float"),
    (lambda g: g.parameters([np.zeros(3), np.zeros(1)]), "2 arrays, the model has 1"),
    (lambda g: g.evaluate_result(0.5, 5, {"sample": 3.0}), "undeclared metrics"),
])
def test_the_guard_stops_anything_else_before_it_is_sent(call, match: str) -> None:
    guard = BoundaryGuard("north", [(3,)], frozenset({"train_loss"}))
    with pytest.raises(BoundaryError, match=match):
        call(guard)
    assert guard.sent == []


def test_an_update_of_the_wrong_shapes_is_refused_before_aggregation() -> None:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    refused: list[str] = []
    strategy = shape_checked(FedAvg, [(3,)], refused)(accept_failures=True)
    ok = Status(code=Code.OK, message="")
    good = FitRes(status=ok, parameters=ndarrays_to_parameters([np.ones(3)]), num_examples=10, metrics={})
    bad = FitRes(status=ok, parameters=ndarrays_to_parameters([np.ones((3, 3))]), num_examples=1000, metrics={})
    aggregated, _ = strategy.aggregate_fit(1, [(None, bad), (None, good)], [])
    np.testing.assert_array_equal(parameters_to_ndarrays(aggregated)[0], np.ones(3))
    assert len(refused) == 1 and "expected float(3,)" in refused[0]
