"""Regions and distances in the core (``meridian.regions``): one formula for the live registry and the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from global_scheduler.federation_sim import REGIONS, rtt_matrix
from meridian.regions import (
    Location,
    Region,
    bandwidth_gbps_for_km,
    haversine_km,
    link_bandwidth_gbps,
    link_rtt_ms,
    rtt_ms_for_km,
)


def test_haversine_against_known_distances() -> None:
    paris, london = Location(48.8566, 2.3522), Location(51.5074, -0.1278)
    assert haversine_km(paris, london) == pytest.approx(343.5, abs=1.0)
    assert haversine_km(paris, paris) == 0.0
    assert haversine_km(Location(0, 0), Location(0, 180)) == pytest.approx(np.pi * 6371.0)  # antipodes


def test_round_trip_and_bandwidth_rules() -> None:
    assert rtt_ms_for_km(0.0) == 2.0
    assert rtt_ms_for_km(660.0) == pytest.approx(12.0)
    assert bandwidth_gbps_for_km(2999.0) == 100.0 and bandwidth_gbps_for_km(3000.0) == 40.0
    north, west = REGIONS["eu-north"], REGIONS["us-west"]
    assert link_rtt_ms(north, west) == pytest.approx(2.0 + haversine_km(north, west) / 66.0)
    assert link_bandwidth_gbps(north, west) == 40.0
    assert link_rtt_ms(north, west.location) == link_rtt_ms(north, west)


def test_the_simulators_table_uses_the_core_type_and_formula() -> None:
    regions = [REGIONS[r] for r in ("eu-north", "eu-central", "sa-east")]
    assert all(isinstance(r, Region) for r in regions)
    rtt, bw = rtt_matrix(regions)
    assert rtt[0, 1] == pytest.approx(link_rtt_ms(regions[0], regions[1]))
    assert rtt[0, 0] == 2.0 and bw[0, 1] == 100.0 and bw[0, 2] == 40.0
    assert REGIONS["eu-central"] == Region("eu-central", "DE", 2020, "DE-LU", 1.30, 50.11, 8.68)
