"""A toy regional task for the federated engine's tests, importable by the spawned process that runs Flower."""

from __future__ import annotations

import numpy as np


class LinearTask:
    """Least squares on a region's own (x, y); the true weights differ a little between regions."""

    metric_names = frozenset({"train_loss"})

    def __init__(self, seed: int, shift: float) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(200, 3))
        self.y = self.x @ np.array([1.0, -2.0, 0.5 + shift]) + rng.normal(scale=0.1, size=200)

    def initial_parameters(self) -> list[np.ndarray]:
        return [np.zeros(3)]

    def loss(self, w: np.ndarray) -> float:
        return float(np.mean((self.x @ w - self.y) ** 2))

    def fit(self, parameters, *, epochs, proximal_mu, seed):
        w = parameters[0].copy()
        for _ in range(10 * epochs):
            grad = 2 * self.x.T @ (self.x @ w - self.y) / len(self.y) + proximal_mu * (w - parameters[0])
            w -= 0.1 * grad
        return [w], len(self.y), {"train_loss": self.loss(w)}

    def evaluate(self, parameters):
        return self.loss(parameters[0]), len(self.y), {}


class JumpTask:
    """A region whose update is ``jump`` whatever the parameters, reported with ``examples`` examples: far
    beyond any clipping norm, so that clipping and the weighting of the average show in the global model."""

    metric_names = frozenset()

    def __init__(self, jump: list[float], examples: int) -> None:
        self.jump = np.asarray(jump, dtype=float)
        self.examples = examples

    def initial_parameters(self) -> list[np.ndarray]:
        return [np.zeros(len(self.jump))]

    def fit(self, parameters, *, epochs, proximal_mu, seed):
        return [parameters[0] + self.jump], self.examples, {}

    def evaluate(self, parameters):
        return float(np.sum(parameters[0] ** 2)), self.examples, {}
