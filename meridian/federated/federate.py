"""One entry point for a federated run, whichever way the regions' updates are summed: in the clear
(:func:`.engine.run_federated`, optionally under differential privacy) or by secure aggregation
(:func:`.secagg.run_secure_federated`). The two cannot be combined: the server-side clipping and noise of
:mod:`.privacy` need each region's update, which SecAgg+ hides from the server."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from meridian.federated.engine import FederatedResult, LocalTask, RoundStats, run_federated
from meridian.federated.privacy import PrivacySettings


def federate(tasks: Mapping[str, LocalTask], *, rounds: int, strategy: str = "fedavg", proximal_mu: float = 0.1,
             seed: int = 0, on_round: Callable[[RoundStats], None] | None = None,
             privacy: PrivacySettings | None = None, secure_aggregation: bool = False,
             max_examples: int = 1) -> FederatedResult:
    """Train over ``tasks`` for ``rounds`` rounds. With ``secure_aggregation``, FedAvg's sums go through
    SecAgg+, which sends each region's ``weights × examples / max_weight``: ``max_examples`` (the largest
    example count a region reports) makes that at most the weights themselves, inside SecAgg+'s range."""
    if not secure_aggregation:
        return run_federated(tasks, rounds=rounds, strategy=strategy, proximal_mu=proximal_mu, seed=seed,
                             on_round=on_round, privacy=privacy)
    if strategy != "fedavg" or privacy is not None:
        raise ValueError("secure aggregation runs FedAvg without server-side privacy: the server's clipping "
                         "and noise need each region's update, which SecAgg+ hides from it")
    from meridian.federated.secagg import run_secure_federated

    return run_secure_federated(tasks, rounds=rounds, seed=seed, on_round=on_round, max_weight=float(max_examples))
