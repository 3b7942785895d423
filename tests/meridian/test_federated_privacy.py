"""Differential privacy in the federated engine: the (ε, δ) budget against independent bounds, and real
Flower runs (toy tasks) that clip each region's update, weigh regions equally, add noise, and repeat with a
noise seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError
from scipy.optimize import brentq
from scipy.stats import norm

from meridian.federated.engine import run_federated
from meridian.federated.privacy import ORDERS, PrivacySettings, privacy_spent
from tests.federated_helpers import JumpTask, LinearTask


def _exact_gaussian_epsilon(z: float, rounds: int, delta: float) -> float:
    """The tight ε of ``rounds`` Gaussian mechanisms of noise multiplier ``z``: together one Gaussian
    mechanism with μ = √rounds / z, whose δ(ε) is Balle & Wang's (2018) analytic formula."""
    mu = math.sqrt(rounds) / z

    def excess(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    return float(brentq(excess, 0.0, 500.0))


def _rdp_epsilon(z: float, rounds: int, delta: float, *, balle: bool) -> float:
    """RDP α·rounds/(2z²), converted to ε at ``delta``: Balle et al.'s (2020) conversion or the classic
    one."""
    def eps(a: float) -> float:
        rdp = rounds * a / (2 * z * z)
        if balle:
            return rdp + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        return rdp + math.log(1 / delta) / (a - 1)
    return min(eps(a) for a in ORDERS)


@pytest.mark.parametrize(("z", "rounds"), [(1.0, 1), (1.0, 10), (2.0, 10), (0.5, 3)])
def test_epsilon_is_the_rdp_bound_of_the_composed_gaussian_mechanism(z: float, rounds: int) -> None:
    eps = privacy_spent(PrivacySettings(noise_multiplier=z, clipping_norm=1.0, delta=1e-5), rounds)
    assert eps == pytest.approx(_rdp_epsilon(z, rounds, 1e-5, balle=True), rel=1e-9)
    exact = _exact_gaussian_epsilon(z, rounds, 1e-5)
    # a valid bound (never below the tight ε), a close one (RDP loses under 15% here), tighter than classic
    assert exact <= eps <= 1.15 * exact
    assert eps < _rdp_epsilon(z, rounds, 1e-5, balle=False)


def test_known_epsilons_and_how_they_move() -> None:
    def eps(z: float, rounds: int, delta: float = 1e-5) -> float:
        return privacy_spent(PrivacySettings(noise_multiplier=z, clipping_norm=1.0, delta=delta), rounds)

    assert eps(1.0, 1) == pytest.approx(4.7285, abs=1e-4)
    assert eps(1.0, 10) == pytest.approx(19.0536, abs=1e-4)
    assert eps(1.0, 0) == 0.0
    assert eps(1.0, 1) < eps(1.0, 2) < eps(1.0, 10) < eps(1.0, 100)
    assert eps(0.5, 10) > eps(1.0, 10) > eps(2.0, 10) > eps(8.0, 10)
    assert eps(1.0, 10, delta=1e-3) < eps(1.0, 10, delta=1e-8)
    # the clipping norm scales the noise with the sensitivity: it does not change ε
    assert privacy_spent(PrivacySettings(noise_multiplier=1.0, clipping_norm=50.0), 10) == eps(1.0, 10)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"noise_multiplier": 0.0, "clipping_norm": 1.0}, "noise_multiplier"),
    ({"noise_multiplier": -1.0, "clipping_norm": 1.0}, "noise_multiplier"),
    ({"noise_multiplier": float("nan"), "clipping_norm": 1.0}, "noise_multiplier"),
    ({"noise_multiplier": 1.0, "clipping_norm": 0.0}, "clipping_norm"),
    ({"noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 0.0}, "delta"),
    ({"noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1.0}, "delta"),
    ({"noise_multiplier": 1.0, "clipping_norm": 1.0, "noise_seed": -1}, "noise_seed"),
    ({"noise_multiplier": 1.0, "clipping_norm": 1.0, "epsilon": 3.0}, "epsilon"),
    ({"clipping_norm": 1.0}, "noise_multiplier"),
])
def test_invalid_settings_are_refused_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        PrivacySettings(**kwargs)
    assert [e["loc"] for e in info.value.errors()] == [(field,)]


def test_each_update_is_clipped_and_regions_weigh_the_same() -> None:
    # Each region jumps 1000 along its own axis, with very different example counts: FedAvg would follow the
    # largest region; clipped and equally weighted, each round moves the model by clip/3 along every axis.
    clip, regions = 0.3, 3
    tasks = {"a": JumpTask([1000.0, 0, 0], 1), "b": JumpTask([0, 1000.0, 0], 100),
             "c": JumpTask([0, 0, 1000.0], 10_000)}
    settings = PrivacySettings(noise_multiplier=0.01, clipping_norm=clip, noise_seed=1)
    result = run_federated(tasks, rounds=2, seed=0, privacy=settings)
    std = 0.01 * clip / regions
    deviation = result.parameters[0] - 2 * np.full(3, clip / regions)
    assert np.abs(deviation).max() < 6 * math.sqrt(2) * std, result.parameters[0]  # two rounds of noise
    assert np.abs(deviation).max() > 0  # and the noise is there
    assert result.privacy is not None and result.privacy["rounds"] == 2 and result.privacy["regions"] == 3


def test_noise_changes_the_model_by_its_scale_and_a_noise_seed_repeats_it() -> None:
    tasks = {"north": LinearTask(1, 0.0), "south": LinearTask(2, 0.3), "west": LinearTask(3, -0.3)}
    # A clipping norm above every update's norm, so that after one round the only difference is the noise.
    settings = PrivacySettings(noise_multiplier=1.0, clipping_norm=20.0, delta=1e-6, noise_seed=5)
    plain = run_federated(tasks, rounds=1, seed=3)
    private = run_federated(tasks, rounds=1, seed=3, privacy=settings)
    again = run_federated(tasks, rounds=1, seed=3, privacy=settings)
    fresh = run_federated(tasks, rounds=1, seed=3, privacy=settings.model_copy(update={"noise_seed": None}))
    np.testing.assert_array_equal(private.parameters[0], again.parameters[0])
    assert not np.array_equal(fresh.parameters[0], private.parameters[0])  # unseeded noise is not repeated
    std = 1.0 * 20.0 / 3
    assert 0.01 * std < np.abs(private.parameters[0] - plain.parameters[0]).max() < 6 * std
    assert plain.privacy is None
    assert private.privacy == {"noise_multiplier": 1.0, "clipping_norm": 20.0, "delta": 1e-6, "rounds": 1,
                               "regions": 3, "noise_std": pytest.approx(std),
                               "epsilon": pytest.approx(privacy_spent(settings, 1)), "noise_seeded": True}
    assert private.privacy["epsilon"] > 0 and fresh.privacy is not None and not fresh.privacy["noise_seeded"]


def test_refused_and_zero_updates_count_as_no_update_so_the_noise_still_covers_one_region() -> None:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    from meridian.federated.engine import with_privacy

    refused: list[str] = []
    settings = PrivacySettings(noise_multiplier=1e-6, clipping_norm=1.0, noise_seed=0)
    strategy = with_privacy(FedAvg, settings, regions=4, shapes=[(3,)], refused=refused)
    start = [np.zeros(3)]
    strategy.current_round_params = start  # what configure_fit records each round, in both strategies
    strategy.strategy.round_parameters = ndarrays_to_parameters(start)
    ok = Status(code=Code.OK, message="")

    def res(arrays: list[np.ndarray], n: int) -> FitRes:
        return FitRes(status=ok, parameters=ndarrays_to_parameters(arrays), num_examples=n, metrics={})

    results = [(None, res([np.array([0.0, 50.0, 0.0])], 1)), (None, res([np.ones((3, 3))], 10)),
               (None, res([np.array([40.0, 0.0, 0.0])], 1000)), (None, res(start, 5))]
    aggregated, _ = strategy.aggregate_fit(1, results, [])
    # (clipped + clipped + no update + zero update) / 4: neither the refused nor the zero update is dropped
    np.testing.assert_allclose(parameters_to_ndarrays(aggregated)[0], [1 / 4, 1 / 4, 0.0], atol=1e-5)
    assert len(refused) == 1
