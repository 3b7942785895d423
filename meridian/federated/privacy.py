"""Differential privacy for federated training: its settings and the privacy budget a run spends.

What is protected: the global model (every round's aggregate, which the clients also receive) against
anyone who sees it, at the level of a whole region: adding or removing one region's data changes what the
model reveals by at most (ε, δ). The server is trusted: it sees each region's unclipped update, clips it to
``clipping_norm`` in L2 norm (Flower's ``DifferentialPrivacyServerSideFixedClipping``), averages the clipped
updates with equal weights over all regions, and adds Gaussian noise of standard deviation
``noise_multiplier × clipping_norm / regions`` to the average. Each round is then a Gaussian mechanism of
noise multiplier ``z = noise_multiplier`` (sensitivity ``clipping_norm / regions``, noise ``z`` times that),
and the rounds compose. A round whose aggregation Flower skips (a client failed) releases nothing and is
counted anyway, so ε stays an upper bound.

Every region takes part in every round, so there is no amplification by subsampling: the budget is the one
of ``rounds`` full-participation Gaussian mechanisms, computed with Opacus's Rényi-DP accountant (per round
``RDP(α) = α / (2 z²)``, summed over rounds, converted to (ε, δ) with Balle et al.'s conversion, which is
tighter than the classic ``RDP + log(1/δ)/(α−1)``).

The noise is secret unless ``noise_seed`` is set (a seeded run repeats exactly, but anyone who knows the
seed can remove the noise). It comes from numpy's Mersenne Twister, as in Flower, not from a cryptographic
generator, and the floating-point sampling is not hardened against attacks on its low-order bits.

Not protected: what the trusted server itself sees (each region's update, its evaluation loss and the
metrics it reports), and therefore the per-round losses and the record of what each client sent that a run
returns.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PrivacySettings(BaseModel):
    """Central differential privacy of a federated run: clip each region's update, add Gaussian noise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Noise standard deviation relative to the sensitivity ``clipping_norm / regions``; larger is more
    #: private.
    noise_multiplier: float = Field(gt=0, allow_inf_nan=False)
    #: The L2 norm each region's update (its parameters minus the global ones) is clipped to.
    clipping_norm: float = Field(gt=0, allow_inf_nan=False)
    #: Probability with which the ε bound may fail; well below 1 / (number of regions) to mean anything.
    delta: float = Field(default=1e-5, gt=0, lt=1)
    #: Seed of the noise, to repeat a run exactly. Whoever knows it can regenerate the noise and subtract it,
    #: so the guarantee holds only against those who do not; None (the default) draws it from the operating
    #: system's entropy, independently of the run's seed.
    noise_seed: int | None = Field(default=None, ge=0)


@dataclass(frozen=True)
class PrivacyReport:
    """The privacy budget a federated run spent, with the settings that spent it."""

    noise_multiplier: float
    clipping_norm: float
    delta: float
    epsilon: float
    rounds: int
    #: Regions averaged each round (the sensitivity's denominator).
    regions: int
    #: Standard deviation of the noise added to each parameter of the average, each round.
    noise_std: float
    #: Whether the noise came from ``noise_seed`` (repeatable, private only against those who do not know it).
    noise_seeded: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Rényi orders searched for the tightest ε: Opacus's default grid (1.1 … 63).
ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)])


def privacy_spent(settings: PrivacySettings, rounds: int) -> float:
    """ε such that ``rounds`` rounds with ``settings`` are (ε, settings.delta)-DP for one region.

    Full participation (sample rate 1): Opacus's ``compute_rdp`` at ``q = 1`` is the plain Gaussian
    mechanism's ``α / (2 z²)`` per round."""
    if rounds < 0:
        raise ValueError(f"rounds must be at least 0, not {rounds}")
    if rounds == 0:
        return 0.0
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    rdp = compute_rdp(q=1.0, noise_multiplier=settings.noise_multiplier, steps=rounds, orders=list(ORDERS))
    with warnings.catch_warnings():
        # Opacus warns when the best order is at the grid's edge (very weak or very strong privacy); the ε it
        # returns is still a valid bound, only not the tightest.
        warnings.simplefilter("ignore", UserWarning)
        epsilon, _ = get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=settings.delta)
    return float(epsilon)


def privacy_report(settings: PrivacySettings, rounds: int, regions: int) -> PrivacyReport:
    """The record a run returns: its settings, ε after ``rounds`` rounds, and the noise it added."""
    return PrivacyReport(noise_multiplier=settings.noise_multiplier, clipping_norm=settings.clipping_norm,
                         delta=settings.delta, epsilon=privacy_spent(settings, rounds), rounds=rounds,
                         regions=regions, noise_seeded=settings.noise_seed is not None,
                         noise_std=settings.noise_multiplier * settings.clipping_norm / regions)
