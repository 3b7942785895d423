from collections import Counter
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meridian.packing_bound import share_packing_bound


def _optimum(shares: tuple[int, ...]) -> int:
    """Exact fewest devices, by dynamic programming over subsets (tiny instances only)."""
    n = len(shares)
    load = [sum(s for i, s in enumerate(shares) if mask >> i & 1) for mask in range(1 << n)]

    @cache
    def devices(rest: int) -> int:
        if rest == 0:
            return 0
        low = rest & -rest  # the lowest item goes somewhere: enumerate its device's other items
        others = rest ^ low
        best, sub = n, others
        while True:
            group = sub | low
            if load[group] <= 1000:
                best = min(best, 1 + devices(rest ^ group))
            if sub == 0:
                break
            sub = (sub - 1) & others
        return best

    return devices((1 << n) - 1)


def _first_fit_decreasing(shares: list[int]) -> int:
    bins: list[int] = []
    for s in sorted(shares, reverse=True):
        for i, b in enumerate(bins):
            if b + s <= 1000:
                bins[i] += s
                break
        else:
            bins.append(s)
    return len(bins)


@pytest.mark.parametrize(("shares", "devices"), [
    ({810: 2, 190: 1}, 2),  # the 0.19 beside one 0.81 is filled, the other's stays idle
    ({500: 3}, 2),  # the LP says 1.5; devices are whole
    ({340: 3}, 2),
    ({250: 4}, 1),
    ({810: 5}, 5),
    ({}, 0),
])
def test_known_instances(shares: dict[int, int], devices: int) -> None:
    bound = share_packing_bound(shares)
    assert bound.devices == devices
    assert bound.idle_gpus == pytest.approx(max(0.0, devices - sum(s * n for s, n in shares.items()) / 1000))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([50, 110, 160, 230, 320, 350, 470, 550, 650, 810, 1000]), min_size=1, max_size=9))
def test_never_above_the_optimum_and_never_below_the_total(shares: list[int]) -> None:
    bound = share_packing_bound(Counter(shares))
    optimum = _optimum(tuple(shares))
    assert sum(shares) / 1000 <= bound.devices <= optimum
    assert bound.devices >= optimum - 1  # the LP is tight on instances like these (round-up property)


def test_openb_like_mix_is_tight_against_a_real_packing() -> None:
    # default's share mix at ~100 % arrived (seed 42): 1,048 shares of 0.81 and only 112 of ≤ 0.19
    mix = {50: 5, 110: 29, 140: 1, 160: 77, 220: 61, 230: 156, 270: 4, 290: 1, 320: 355, 330: 10, 350: 6,
           370: 44, 440: 2, 460: 135, 470: 760, 480: 24, 550: 80, 590: 74, 650: 261, 810: 1048}
    bound = share_packing_bound(mix)
    ffd = _first_fit_decreasing([s for s, n in mix.items() for _ in range(n)])
    assert bound.devices <= ffd <= bound.devices + 15
    assert bound.idle_gpus > (1048 - 112) * 0.19  # the unpaired 0.81 shares alone leave this much


def test_an_iteration_cap_weakens_the_bound_but_keeps_it_valid() -> None:
    mix = {230: 40, 320: 33, 470: 51, 650: 29, 810: 60}
    full = share_packing_bound(mix)
    capped = share_packing_bound(mix, max_iterations=1)
    assert capped.iterations == 1 and full.iterations > 1
    assert sum(s * n for s, n in mix.items()) / 1000 <= capped.devices <= full.devices


@pytest.mark.parametrize("bad", [0, -5, 1001])
def test_a_share_outside_one_device_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=r"GPU share must be in 1\.\.1000"):
        share_packing_bound({bad: 1, 500: 1})
