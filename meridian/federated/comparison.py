"""The result of comparing a federated model with each region's local one and a centrally trained one, on
every region's held-out data: what ``meridian bench federated`` reports for every federated model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meridian.federated.engine import RoundStats


@dataclass
class Comparison:
    """Per region (``regions[name]``: ``untrained``, ``local``, ``federated``, ``federated_finetuned``,
    ``central`` and model-specific extras) and over all regions (``totals``), with the federated run's rounds
    (wall time and bytes each way), wall time per phase and refused updates."""

    regions: dict[str, dict[str, Any]]
    totals: dict[str, Any]
    rounds: list[RoundStats]
    wall_s: dict[str, float]
    refused_updates: int
    #: The differential-privacy budget of the federated model (:class:`~meridian.federated.privacy.PrivacyReport`
    #: as a dict), or None when it was trained without.
    privacy: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"regions": self.regions, "totals": self.totals, "refused_updates": self.refused_updates,
                "wall_s": self.wall_s, "privacy": self.privacy,
                "rounds": [{"round": r.round, "wall_s": round(r.wall_s, 3), "bytes_to_server": r.bytes_to_server,
                            "bytes_from_server": r.bytes_from_server, "validation_loss": r.loss} for r in self.rounds]}
