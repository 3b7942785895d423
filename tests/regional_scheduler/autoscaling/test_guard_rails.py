"""Every guard rail, property-based over random policy outputs: the guarded output never breaks a rail."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional_scheduler.autoscaling.guard_rails import GuardRails
from regional_scheduler.autoscaling.settings import GuardRailSettings

MIN, MAX = 2, 60
RAILS = GuardRailSettings(min_replicas=MIN, max_replicas=MAX, max_scale_down_fraction=0.5,
                          scale_down_cooldown_s=180.0, breach_target_utilisation=0.6)

step = st.tuples(
    st.integers(min_value=-1000, max_value=1000),  # whatever the policy proposes, even nonsense
    st.floats(min_value=1.0, max_value=400.0),  # seconds since the previous decision
    st.booleans(),  # SLO breached
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0)),  # observed utilisation
)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(min_value=MIN, max_value=MAX), steps=st.lists(step, min_size=1, max_size=40))
def test_guarded_output_never_breaks_a_rail(start: int, steps: list[tuple[int, float, bool, float | None]]) -> None:
    rails = GuardRails(RAILS)
    current, now, last_down = start, 0.0, None
    for proposed, gap, breached, utilisation in steps:
        now += gap
        out = rails.apply(proposed=proposed, current=current, now_s=now, slo_breached=breached,
                          utilisation=utilisation).replicas
        # Bounds.
        assert MIN <= out <= MAX
        if out < current:
            # At most 50% removed in one decision.
            assert out >= math.ceil(current * 0.5)
            # At least 3 minutes since the previous scale-down.
            assert last_down is None or now - last_down >= 180.0
            # Never a scale-down while the SLO is breached.
            assert not breached
            last_down = now
        if breached:
            # Immediate scale-up on a breach (unless already at the maximum).
            assert out > current or current == MAX
        current = out


@settings(max_examples=200, deadline=None)
@given(proposed=st.integers(min_value=MIN, max_value=MAX), current=st.integers(min_value=MIN, max_value=MAX))
def test_a_proposal_inside_every_rail_passes_unchanged(proposed: int, current: int) -> None:
    if proposed < current and proposed < math.ceil(current * 0.5):
        return
    out = GuardRails(RAILS).apply(proposed=proposed, current=current, now_s=0.0, slo_breached=False,
                                  utilisation=0.5)
    assert out.replicas == proposed and out.rails == ()


@pytest.mark.parametrize(
    ("proposed", "current", "breached", "utilisation", "expected", "rail"),
    [
        # 40 → 10 is 75% down; at most 50%: ceil(40 × 0.5) = 20.
        pytest.param(10, 40, False, 0.3, 20, "scale_down_step", id="step-limits-scale-down"),
        # Breach at 90% with 10 replicas: ceil(10 × 0.9 / 0.6) = 15 even if the policy wanted 8.
        pytest.param(8, 10, True, 0.9, 15, "slo_breach_scale_up", id="breach-scales-up-proportionally"),
        # Breach with no utilisation reading: at least one more replica.
        pytest.param(10, 10, True, None, 11, "slo_breach_scale_up", id="breach-adds-at-least-one"),
        pytest.param(500, 10, False, 0.5, MAX, "max_replicas", id="max-bound"),
        pytest.param(-3, MIN, False, 0.5, MIN, "min_replicas", id="min-bound"),
    ],
)
def test_rail_examples(proposed: int, current: int, breached: bool, utilisation: float | None, expected: int,
                       rail: str) -> None:
    out = GuardRails(RAILS).apply(proposed=proposed, current=current, now_s=1000.0, slo_breached=breached,
                                  utilisation=utilisation)
    assert out.replicas == expected
    assert rail in out.rails


def test_cooldown_holds_second_scale_down_within_three_minutes() -> None:
    rails = GuardRails(RAILS)
    assert rails.apply(proposed=15, current=20, now_s=0.0, slo_breached=False, utilisation=0.3).replicas == 15
    held = rails.apply(proposed=10, current=15, now_s=179.0, slo_breached=False, utilisation=0.3)
    assert held.replicas == 15 and held.rails == ("scale_down_cooldown",)
    assert rails.apply(proposed=10, current=15, now_s=180.0, slo_breached=False, utilisation=0.3).replicas == 10
