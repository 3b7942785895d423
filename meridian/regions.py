"""Regions and the distances between them: one type and one formula for the live scheduler and the simulator.

A :class:`Region` is where clusters run: a location (for distances), the site's PUE, the electricity price
area and the carbon zone of its grid. Which regions exist is data, never code: the live global scheduler
reads them from its federation configuration (``global_scheduler.federation_config``, documented in
docs/federation-config.md); the federation simulator keeps its own benchmark table
(``global_scheduler.federation_sim.REGIONS``) of the same type.

Round trip between two regions (:func:`link_rtt_ms`) is ``2 + km / 66`` ms over their great-circle
distance (:func:`haversine_km`): fibre carries light at about 2/3 c (200 km/ms, 100 km of distance per ms
of round trip), and routes are about 1.5× the great circle, so ~66 km per ms of round trip, plus 2 ms
inside the region. Links shorter than 3,000 km are taken as 100 Gb/s, longer ones as 40 Gb/s
(:func:`link_bandwidth_gbps`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Mean Earth radius (km), as haversine distances conventionally use.
EARTH_RADIUS_KM = 6371.0
#: Round trip inside one region (ms) and between two sites at the same place.
LOCAL_RTT_MS = 2.0
#: Great-circle km per ms of round trip (fibre at 2/3 c, routes 1.5× the great circle).
KM_PER_RTT_MS = 66.0
#: Links shorter than this (km) are regional (100 Gb/s); longer ones intercontinental (40 Gb/s).
REGIONAL_LINK_KM = 3000.0


@dataclass(frozen=True)
class Location:
    """A point on Earth in degrees (WGS 84)."""

    lat: float
    lon: float


@dataclass(frozen=True)
class Region:
    """A region: name, the carbon zone of its grid (Electricity Maps-style id, e.g. ``DE``), the year of that
    zone's series a replay reads (0: not given), the electricity price area (ENTSO-E bidding area, e.g.
    ``DE-LU``; empty: not given), the site's PUE (None: not given) and its location in degrees."""

    name: str
    carbon_zone: str
    carbon_year: int
    price_area: str
    pue: float | None
    lat: float
    lon: float

    @property
    def location(self) -> Location:
        return Location(self.lat, self.lon)


def haversine_km(a: Region | Location, b: Region | Location) -> float:
    """Great-circle distance (km) between two regions or locations."""
    p1, p2 = math.radians(a.lat), math.radians(b.lat)
    dp, dl = p2 - p1, math.radians(b.lon - a.lon)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(min(1.0, h)))


def rtt_ms_for_km(km: float) -> float:
    """Round trip (ms) over a great-circle distance of ``km`` (module docstring)."""
    return LOCAL_RTT_MS + km / KM_PER_RTT_MS


def bandwidth_gbps_for_km(km: float) -> float:
    """Assumed bandwidth (Gb/s) of a link of ``km``: 100 regional, 40 intercontinental."""
    return 100.0 if km < REGIONAL_LINK_KM else 40.0


def link_rtt_ms(a: Region | Location, b: Region | Location) -> float:
    """Round trip (ms) between two regions or locations."""
    return rtt_ms_for_km(haversine_km(a, b))


def link_bandwidth_gbps(a: Region | Location, b: Region | Location) -> float:
    """Assumed bandwidth (Gb/s) between two regions or locations."""
    return bandwidth_gbps_for_km(haversine_km(a, b))
