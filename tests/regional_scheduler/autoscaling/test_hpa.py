"""The HPA against the Kubernetes documentation's worked examples ("Algorithm details",
"Configurable scaling behavior") and the controller's rules for unready pods."""

from __future__ import annotations

import pytest

from regional_scheduler.autoscaling.hpa import (
    HpaBehavior,
    HpaController,
    HpaSpec,
    PolicyType,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    replicas_from_utilisation,
)


@pytest.mark.parametrize(
    ("current", "ready", "unready", "utilisation", "target", "expected"),
    [
        # Docs: metric 200m vs desired 100m → ratio 2.0 → replicas doubled: ceil(3 × 2.0) = 6.
        pytest.param(3, 3, 0, 0.200, 0.100, 6, id="docs-200m-over-100m-doubles"),
        # Docs: metric 50m vs desired 100m → ratio 0.5 → halved: ceil(4 × 0.5) = 2.
        pytest.param(4, 4, 0, 0.050, 0.100, 2, id="docs-50m-over-100m-halves"),
        # KEP-4951 blog: 50 replicas at 90% with a 75% target → ceil(50 × 90/75) = 60.
        pytest.param(50, 50, 0, 0.90, 0.75, 60, id="blog-50-replicas-90-over-75"),
        # Tolerance 0.1: ratio 0.65/0.6 = 1.083 is within 10% of 1.0 → no change.
        pytest.param(10, 10, 0, 0.65, 0.60, 10, id="within-tolerance-up"),
        # 0.55/0.6 = 0.917, within tolerance → no change.
        pytest.param(10, 10, 0, 0.55, 0.60, 10, id="within-tolerance-down"),
        # 0.67/0.6 = 1.117 > 1.1 → ceil(10 × 1.117) = 12.
        pytest.param(10, 10, 0, 0.67, 0.60, 12, id="just-outside-tolerance"),
        # Unready pods count as 0% when scaling up: 4 ready at 0.9, 1 unready, target 0.6:
        # new ratio = 0.9 × 4 / 5 / 0.6 = 1.2 → ceil(1.2 × 5) = 6.
        pytest.param(5, 4, 1, 0.90, 0.60, 6, id="unready-counted-at-zero"),
        # 4 ready at 0.9, 2 unready: 0.9 × 4 / 6 / 0.6 = 1.0 → within tolerance → keep 6.
        pytest.param(6, 4, 2, 0.90, 0.60, 6, id="unready-brings-ratio-within-tolerance"),
        # 4 ready at 0.9, 4 unready: 0.9 × 4 / 8 / 0.6 = 0.75 < 1 reverses the direction → keep 8.
        pytest.param(8, 4, 4, 0.90, 0.60, 8, id="unready-reverses-direction"),
        # Scaling down ignores unready pods: 4 ready at 0.3 with 2 unready → ceil(0.5 × 4) = 2.
        pytest.param(6, 4, 2, 0.30, 0.60, 2, id="scale-down-ignores-unready"),
    ],
)
def test_replica_calculation(current: int, ready: int, unready: int, utilisation: float, target: float,
                             expected: int) -> None:
    assert replicas_from_utilisation(current_replicas=current, ready_pods=ready, unready_pods=unready,
                                     utilisation=utilisation, target=target, tolerance=0.1) == expected


def _sync(hpa: HpaController, now: float, current: int, utilisation: float) -> int:
    return hpa.desired_replicas(now_s=now, current_replicas=current, ready_pods=current, unready_pods=0,
                                utilisation=utilisation)


def test_scale_down_stabilisation_window_keeps_highest_recommendation_for_300s() -> None:
    hpa = HpaController(HpaSpec(min_replicas=1, max_replicas=100, target_utilisation=0.6))
    # t=0: at target → recommendation 10.
    assert _sync(hpa, 0.0, 10, 0.6) == 10
    # Load halves: each sync recommends ceil(10 × 0.3/0.6) = 5, but the window still holds 10 from t=0.
    for now in range(15, 300, 15):
        assert _sync(hpa, float(now), 10, 0.3) == 10, now
    # At t=300 the t=0 recommendation leaves the window (kept only if newer than now − 300): → 5.
    assert _sync(hpa, 300.0, 10, 0.3) == 5


def test_scale_up_is_not_stabilised_by_default() -> None:
    hpa = HpaController(HpaSpec(min_replicas=1, max_replicas=100, target_utilisation=0.6))
    assert _sync(hpa, 0.0, 4, 0.6) == 4
    # 4 × 0.9/0.6 = 6 immediately (default scale-up window 0 s; 100%/15 s allows up to 8).
    assert _sync(hpa, 15.0, 4, 0.9) == 6


def test_default_scale_up_policy_is_max_of_100_percent_or_4_pods_per_15s() -> None:
    hpa = HpaController(HpaSpec(min_replicas=1, max_replicas=100, target_utilisation=0.5))
    # 1 replica at 100% with a 50% target wants 2 × ... keep it saturated at 1.0 → ratio 2 each time;
    # use a huge utilisation so only the rate limit binds: limit = max(ceil(1 × 2), 1 + 4) = 5.
    assert _sync(hpa, 0.0, 1, 10.0) == 5
    # 15 s later the t=0 event is outside the 15 s period: from 5, max(10, 9) = 10.
    assert _sync(hpa, 15.0, 5, 10.0) == 10
    # Then max(20, 14) = 20.
    assert _sync(hpa, 30.0, 10, 10.0) == 20
    # Within the same period the added replicas count: another sync at t=35 has period start
    # 20 − 10 = 10 → limit max(20, 14) = 20 → no further growth.
    assert _sync(hpa, 35.0, 20, 10.0) == 20


def test_docs_scale_down_example_percent_and_pods_policies() -> None:
    """Docs: scaleDown policies Pods 4/60 s and Percent 10/60 s (selectPolicy Max); 80 replicas
    scaling to 10 first drop 8 (10% of 80), then 8 again (10% of 72 = 7.2, rounded up) a period later."""
    behavior = HpaBehavior(scale_down=ScalingRules(stabilization_window_seconds=0, policies=[
        ScalingPolicy(type=PolicyType.PODS, value=4, period_seconds=60),
        ScalingPolicy(type=PolicyType.PERCENT, value=10, period_seconds=60)]))
    hpa = HpaController(HpaSpec(min_replicas=1, max_replicas=100, target_utilisation=0.6, behavior=behavior))
    low = 0.6 * 10 / 80  # recommends 10 replicas out of 80
    assert _sync(hpa, 0.0, 80, low) == 72
    # Within the 60 s period the 8 already removed count: period start is 80 → still 72.
    assert _sync(hpa, 15.0, 72, 0.6 * 10 / 72) == 72
    # One period later: int(72 × 0.9) = 64 (8 removed), Pods would only allow 68; Max picks 64.
    assert _sync(hpa, 60.0, 72, 0.6 * 10 / 72) == 64


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        pytest.param(SelectPolicy.MIN, 76, id="min-picks-smallest-change"),
        pytest.param(SelectPolicy.MAX, 72, id="max-picks-largest-change"),
        pytest.param(SelectPolicy.DISABLED, 80, id="disabled-never-scales-down"),
    ],
)
def test_select_policy_on_scale_down(select: SelectPolicy, expected: int) -> None:
    behavior = HpaBehavior(scale_down=ScalingRules(stabilization_window_seconds=0, select_policy=select, policies=[
        ScalingPolicy(type=PolicyType.PODS, value=4, period_seconds=60),
        ScalingPolicy(type=PolicyType.PERCENT, value=10, period_seconds=60)]))
    hpa = HpaController(HpaSpec(min_replicas=1, max_replicas=100, target_utilisation=0.6, behavior=behavior))
    assert _sync(hpa, 0.0, 80, 0.6 * 10 / 80) == expected


@pytest.mark.parametrize(
    ("current", "utilisation", "expected"),
    [
        pytest.param(3, 0.05, 2, id="min-replicas-floor"),
        pytest.param(9, 2.0, 10, id="max-replicas-ceiling"),
        pytest.param(12, 0.6, 10, id="above-max-is-brought-to-max"),
        pytest.param(1, 0.6, 2, id="below-min-is-brought-to-min"),
    ],
)
def test_min_max_bounds(current: int, utilisation: float, expected: int) -> None:
    hpa = HpaController(HpaSpec(min_replicas=2, max_replicas=10, target_utilisation=0.6,
                                behavior=HpaBehavior(scale_down=ScalingRules(
                                    stabilization_window_seconds=0,
                                    policies=[ScalingPolicy(type=PolicyType.PERCENT, value=100, period_seconds=15)]))))
    assert _sync(hpa, 0.0, current, utilisation) == expected


def test_no_metrics_means_no_change() -> None:
    hpa = HpaController(HpaSpec(min_replicas=1, max_replicas=10))
    assert hpa.desired_replicas(now_s=0.0, current_replicas=4, ready_pods=0, unready_pods=4, utilisation=None) == 4
