"""Federated training on Flower: one server, one client per region, over gRPC on loopback.

Each region keeps its data: a :class:`LocalTask` trains on it and evaluates on it, and only model
parameters and a few scalar metrics leave the client. The server is Flower's (``flwr.server.start_server``,
its gRPC server) with a Flower strategy (``FedAvg`` or ``FedProx``); each client is a Flower ``NumPyClient``
connected with ``flwr.client.start_client``. Both are the legacy entry points of Flower's deployment engine
(Flower 1.42 prints deprecation warnings for them; the SuperLink/SuperNode processes replace them), used here
because they run a real server and real clients in one process, without the simulation engine's Ray.

What crosses the boundary is checked, not assumed: :class:`BoundaryGuard` wraps each client and inspects
every reply it sends (parameters, fit results, evaluation results). Anything but float arrays of the
model's shapes, an example count, and scalar metrics whose names the task declares raises
:class:`BoundaryError` in the client, so that reply is never sent.

Robustness: :class:`ShapeCheckedFedAvg` and :class:`ShapeCheckedFedProx` drop a client update whose
arrays do not have the global model's shapes before aggregation, and count it (a buggy or hostile client
cannot poison or crash the round). Aggregation sorts the updates by content, so the result does not
depend on the order in which the clients answer, and the same seed gives the same model.

Optional central differential privacy (``run_federated(..., privacy=PrivacySettings(...))``, see
:mod:`meridian.federated.privacy` for what it protects): Flower's
``DifferentialPrivacyServerSideFixedClipping`` wraps the strategy, so the server clips each region's update
and adds Gaussian noise to their average, and the run reports the (ε, δ) budget it spent.

Each run is a child process (:func:`run_federated`): ``start_server`` installs process-wide signal handlers
and must own its process's main thread. Flower's telemetry is switched off there (``FLWR_TELEMETRY_ENABLED=0``).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from queue import Empty
from typing import Any, Protocol

import numpy as np

from meridian.federated.privacy import PrivacySettings, privacy_report

log = logging.getLogger(__name__)

Arrays = list[np.ndarray]


class BoundaryError(RuntimeError):
    """A client was about to send something other than model parameters and declared scalar metrics."""


class LocalTask(Protocol):
    """One region's training, on data that never leaves it."""

    #: Scalar metrics this task may report to the server (names only; values are numbers).
    metric_names: frozenset[str]

    def initial_parameters(self) -> Arrays: ...

    def fit(self, parameters: Arrays, *, epochs: int, proximal_mu: float, seed: int) -> tuple[Arrays, int, dict[str, float]]:
        """Train from ``parameters`` on the region's training data; FedProx adds ``mu/2 ||w - w_global||²``."""
        ...

    def evaluate(self, parameters: Arrays) -> tuple[float, int, dict[str, float]]:
        """Loss of ``parameters`` on the region's own validation data."""
        ...


def _checked(arrays: Sequence[Any], shapes: Sequence[tuple[int, ...]], who: str) -> None:
    if len(arrays) != len(shapes):
        raise BoundaryError(f"{who}: {len(arrays)} arrays, the model has {len(shapes)}")
    for i, (a, shape) in enumerate(zip(arrays, shapes, strict=True)):
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f" or a.shape != shape:
            raise BoundaryError(f"{who}: array {i} is {type(a).__name__} "
                                f"{getattr(a, 'dtype', '?')}{getattr(a, 'shape', '')}, expected float{shape}")


def _metrics_checked(metrics: Mapping[str, Any], allowed: frozenset[str], who: str) -> None:
    extra = sorted(set(metrics) - allowed)  # Flower itself needs no metric: the task declares all it sends
    if extra:
        raise BoundaryError(f"{who}: undeclared metrics {extra}")
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BoundaryError(f"{who}: metric {name!r} is {type(value).__name__}, not a number")


@dataclass
class BoundaryGuard:
    """Checks, and records, every reply one region's client sends to the server."""

    region: str
    shapes: list[tuple[int, ...]]
    metric_names: frozenset[str]
    sent: list[tuple[str, Any]] = field(default_factory=list)

    def parameters(self, arrays: Arrays) -> Arrays:
        _checked(arrays, self.shapes, f"{self.region} parameters")
        self.sent.append(("parameters", [a.copy() for a in arrays]))
        return arrays

    def fit_result(self, arrays: Arrays, n: int, metrics: dict[str, float]) -> tuple[Arrays, int, dict[str, float]]:
        _checked(arrays, self.shapes, f"{self.region} fit")
        _metrics_checked(metrics, self.metric_names, f"{self.region} fit")
        if not isinstance(n, int) or n < 0:
            raise BoundaryError(f"{self.region} fit: example count {n!r}")
        self.sent.append(("fit", ([a.copy() for a in arrays], n, dict(metrics))))
        return arrays, n, metrics

    def evaluate_result(self, loss: float, n: int, metrics: dict[str, float]) -> tuple[float, int, dict[str, float]]:
        _metrics_checked({"loss": loss, **metrics}, self.metric_names | {"loss"}, f"{self.region} evaluate")
        self.sent.append(("evaluate", (float(loss), n, dict(metrics))))
        return loss, n, metrics


def numpy_client(task: LocalTask, guard: BoundaryGuard, *, epochs: int, seed: int) -> Any:
    """A Flower ``NumPyClient`` for one region's ``task``, every reply checked by ``guard``: the same client
    whichever way the server aggregates (the plain engine here, SecAgg+ in :mod:`.secagg`)."""
    from flwr.client import NumPyClient

    class RegionClient(NumPyClient):  # type: ignore[misc]
        """Flower's view of one region: every reply goes through the region's guard."""

        def get_parameters(self, config: dict[str, Any]) -> Arrays:
            return guard.parameters(task.initial_parameters())

        def fit(self, parameters: Arrays, config: dict[str, Any]) -> tuple[Arrays, int, dict[str, float]]:
            mu = float(config.get("proximal_mu", 0.0))
            round_seed = seed * 1000 + int(config.get("server_round", 0))
            return guard.fit_result(*task.fit(parameters, epochs=epochs, proximal_mu=mu, seed=round_seed))

        def evaluate(self, parameters: Arrays, config: dict[str, Any]) -> tuple[float, int, dict[str, float]]:
            return guard.evaluate_result(*task.evaluate(parameters))

    return RegionClient()


def _digest(arrays: Arrays) -> bytes:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def shape_checked(strategy_cls: type, shapes: list[tuple[int, ...]], refused: list[str]) -> type:
    """``strategy_cls`` (a Flower strategy) that refuses updates of the wrong shapes and aggregates in a fixed
    order. ``refused`` collects a line per refused update."""
    from flwr.common import parameters_to_ndarrays

    class ShapeChecked(strategy_cls):  # type: ignore[misc, valid-type]
        def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
            kept = []
            for proxy, res in results:
                arrays = parameters_to_ndarrays(res.parameters)
                try:
                    _checked(arrays, shapes, f"round {server_round} update")
                except BoundaryError as exc:
                    refused.append(str(exc))
                    log.warning("refused a client update: %s", exc)
                    continue
                kept.append((_digest(arrays), res.num_examples, proxy, res))
            kept.sort(key=lambda item: (item[0], item[1]))
            return super().aggregate_fit(server_round, [(p, r) for _, _, p, r in kept], failures)

    ShapeChecked.__name__ = f"ShapeChecked{strategy_cls.__name__}"
    return ShapeChecked


def with_privacy(strategy_cls: type, settings: PrivacySettings, *, regions: int,
                 shapes: list[tuple[int, ...]], refused: list[str], **kwargs: Any) -> Any:
    """``strategy_cls(**kwargs)`` (a Flower strategy) wrapped in Flower's
    ``DifferentialPrivacyServerSideFixedClipping``.

    The wrapper clips each update (parameters minus the round's global ones) to ``settings.clipping_norm``,
    lets the strategy aggregate the clipped updates, and adds Gaussian noise of standard deviation
    ``noise_multiplier × clipping_norm / regions`` to the aggregate. That noise covers a change of
    ``clipping_norm / regions`` in the aggregate, which holds only for the equally weighted mean over all
    ``regions``; so, around Flower's wrapper:

    * updates of the wrong shapes are refused first (:func:`shape_checked`; Flower's clipping would fail on
      them) and the rest are put in content order;
    * every update weighs the same (FedAvg would weigh regions by their example counts, which would let one
      region move the mean by more than ``clipping_norm / regions``);
    * a refused update, and a zero one (Flower's clipping divides by the update's norm), count as no update:
      the strategy averages the round's global parameters in their place, so the mean still divides by
      ``regions``;
    * the noise comes from numpy's global generator (Flower's ``add_gaussian_noise_inplace`` draws from
      ``np.random``), reseeded each round: from the operating system's entropy, or, when
      ``settings.noise_seed`` is set, from it and the round, so that a run can be repeated exactly. The
      generator's previous state is put back after the round."""
    from flwr.common import Code, FitRes, Status, parameters_to_ndarrays
    from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping
    from flwr.supercore.differential_privacy import get_norm

    class Padded(strategy_cls):  # type: ignore[misc, valid-type]
        """Averages over ``regions`` updates: the round's global parameters stand in for the missing ones."""

        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            self.round_parameters = parameters
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
            no_update = FitRes(status=Status(code=Code.OK, message=""), parameters=self.round_parameters,
                               num_examples=1, metrics={})
            padding = [(None, no_update)] * (regions - len(results))
            return super().aggregate_fit(server_round, [*results, *padding], failures)

    class EquallyWeighted(DifferentialPrivacyServerSideFixedClipping):  # type: ignore[misc]
        def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
            moved = []
            for proxy, res in results:
                arrays = parameters_to_ndarrays(res.parameters)
                update = [a - g for a, g in zip(arrays, self.current_round_params, strict=True)]
                if get_norm(update) > 0:
                    moved.append((proxy, FitRes(status=res.status, parameters=res.parameters, num_examples=1,
                                                metrics=res.metrics)))
            entropy = None if settings.noise_seed is None else [settings.noise_seed, server_round]
            state = np.random.get_state()
            np.random.seed(np.random.SeedSequence(entropy).generate_state(4))
            try:
                return super().aggregate_fit(server_round, moved, failures)
            finally:
                np.random.set_state(state)

    cls = shape_checked(EquallyWeighted, shapes, refused)
    cls.__name__ = "PrivateShapeChecked"
    return cls(Padded(**kwargs), noise_multiplier=settings.noise_multiplier,
               clipping_norm=settings.clipping_norm, num_sampled_clients=regions)


@dataclass
class RoundStats:
    round: int
    wall_s: float
    bytes_to_server: int
    bytes_from_server: int
    loss: float | None


@dataclass
class FederatedResult:
    parameters: Arrays
    rounds: list[RoundStats]
    refused_updates: list[str]
    sent: dict[str, list[tuple[str, Any]]]
    #: With differential privacy: :class:`~meridian.federated.privacy.PrivacyReport` as a dict
    #: (noise_multiplier, clipping_norm, delta, epsilon, rounds, regions, noise_std, noise_seeded). It covers
    #: ``parameters`` only; ``rounds`` (losses) and ``sent`` are the trusted server's view, not private.
    privacy: dict[str, Any] | None = None


def run_federated(tasks: Mapping[str, LocalTask], *, rounds: int, strategy: str = "fedavg", proximal_mu: float = 0.1,
                  epochs: int = 1, seed: int = 0, on_round: Callable[[RoundStats], None] | None = None,
                  timeout_s: float = 3600.0, privacy: PrivacySettings | None = None) -> FederatedResult:
    """Train one model over ``tasks`` (region → task, picklable) for ``rounds`` rounds on a Flower server and one
    Flower client per region, over gRPC on loopback. Returns the global parameters and per-round wall time and bytes.

    With ``privacy``, the server clips each region's update and adds Gaussian noise to their (equally
    weighted) average (:func:`with_privacy`), and the result reports the (ε, δ) the ``rounds`` rounds spent.

    The server and its clients run in a child process: Flower's server installs process-wide signal handlers
    and its clients may signal their own process when they give up on a server, which must not reach the
    caller (a test runner, a CLI, a service)."""
    if strategy not in ("fedavg", "fedprox"):
        raise ValueError(f"unknown strategy {strategy!r}: fedavg or fedprox")
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    child = ctx.Process(target=_federated_main, name="flower-federation",
                        args=(queue, dict(tasks), rounds, strategy, proximal_mu, epochs, seed, privacy))
    child.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                kind, body = queue.get(timeout=1.0)
            except Empty:
                if not child.is_alive():
                    raise RuntimeError(f"the federated run ended without a result (exit code {child.exitcode})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the federated run took longer than {timeout_s:g} s") from None
                continue
            if kind == "round" and on_round is not None:
                on_round(body)
            elif kind == "error":
                raise RuntimeError(f"the federated run failed: {body}")
            elif kind == "done":
                if privacy is not None:
                    body.privacy = privacy_report(privacy, rounds, len(tasks)).as_dict()
                return body  # type: ignore[no-any-return]
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()
            child.join(timeout=10)


def _federated_main(queue: Any, tasks: dict[str, LocalTask], rounds: int, strategy: str, proximal_mu: float,
                    epochs: int, seed: int, privacy: PrivacySettings | None = None) -> None:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # Flower reports usage over the network unless told not to
    # Flower logs every round, a deprecation notice per client and each client's shutdown at INFO/WARNING; the
    # run reports its own progress, and this process holds nothing else that logs to "flwr".
    logging.getLogger("flwr").setLevel(logging.ERROR)
    try:
        result = _run_here(tasks, rounds=rounds, strategy=strategy, proximal_mu=proximal_mu, epochs=epochs, seed=seed,
                           on_round=lambda s: queue.put(("round", s)), privacy=privacy)
    except BaseException as exc:  # reported to the parent, which raises it
        queue.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    queue.put(("done", result))


def _run_here(tasks: Mapping[str, LocalTask], *, rounds: int, strategy: str, proximal_mu: float, epochs: int,
              seed: int, on_round: Callable[[RoundStats], None],
              privacy: PrivacySettings | None = None) -> FederatedResult:
    import flwr as fl
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    names = sorted(tasks)
    initial = tasks[names[0]].initial_parameters()
    shapes = [a.shape for a in initial]
    n_bytes = sum(a.nbytes for a in initial)
    refused: list[str] = []
    guards = {name: BoundaryGuard(name, shapes, tasks[name].metric_names) for name in names}
    base = fl.server.strategy.FedAvg if strategy == "fedavg" else fl.server.strategy.FedProx
    stats: list[RoundStats] = []
    clock = {"t": time.perf_counter()}

    def fit_config(server_round: int) -> dict[str, Any]:
        return {"server_round": server_round}

    def evaluate_metrics(results: list[tuple[int, dict[str, Any]]]) -> dict[str, float]:
        return {}

    def round_done(server_round: int, loss: float | None) -> None:
        now = time.perf_counter()
        s = RoundStats(server_round, now - clock["t"], bytes_to_server=len(names) * n_bytes,
                       bytes_from_server=len(names) * n_bytes, loss=loss)
        clock["t"] = now
        stats.append(s)
        on_round(s)

    kwargs: dict[str, Any] = dict(fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=len(names),
                                  min_evaluate_clients=len(names), min_available_clients=len(names),
                                  initial_parameters=ndarrays_to_parameters(initial), on_fit_config_fn=fit_config,
                                  evaluate_metrics_aggregation_fn=evaluate_metrics)
    if strategy == "fedprox":
        kwargs["proximal_mu"] = proximal_mu
    cls = shape_checked(base, shapes, refused)

    class Reporting(cls):  # type: ignore[misc, valid-type]
        def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
            out = super().aggregate_evaluate(server_round, results, failures)
            round_done(server_round, None if out[0] is None else float(out[0]))
            return out

    if privacy is None:
        server_strategy = Reporting(**kwargs)
    else:
        server_strategy = with_privacy(Reporting, privacy, regions=len(names), shapes=shapes, refused=refused,
                                       **kwargs)
    address = f"127.0.0.1:{_free_port()}"
    clients = [threading.Thread(target=_client_main, args=(address, tasks[n], guards[n], epochs, seed),
                                daemon=True, name=f"flower-client-{n}") for n in names]
    for c in clients:
        c.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Flower logs every round and a deprecation notice per client at WARNING; this run reports its own.
        history_logger = logging.getLogger("flwr")
        level = history_logger.level
        history_logger.setLevel(logging.ERROR)
        try:
            server = fl.server.Server(client_manager=fl.server.SimpleClientManager(), strategy=server_strategy)
            fl.server.start_server(server_address=address, server=server,
                                   config=fl.server.ServerConfig(num_rounds=rounds))
        finally:
            history_logger.setLevel(level)
    for c in clients:
        c.join(timeout=30)
    final = parameters_to_ndarrays(server.parameters)
    return FederatedResult(parameters=final, rounds=stats, refused_updates=refused,
                           sent={n: g.sent for n, g in guards.items()})


def _client_main(address: str, task: LocalTask, guard: BoundaryGuard, epochs: int, seed: int) -> None:
    import flwr as fl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Flower's own connection retries cover a server that is not listening yet.
        fl.client.start_client(server_address=address, insecure=True, max_wait_time=60.0,
                               client=numpy_client(task, guard, epochs=epochs, seed=seed).to_client())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
