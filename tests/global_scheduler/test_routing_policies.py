"""Routing baselines, the filter's diagnosis and the staged router, on hand-made clusters."""

from __future__ import annotations

import numpy as np
import pytest

from global_scheduler.routing.base import DEFER, NO_CLUSTER, Router, RoutingStageError, select
from global_scheduler.routing.feasibility import feasible_mask
from global_scheduler.routing.registry import BASELINES, get_policy, names
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures, available_replicas

GIB = 2**30


def clusters(free_cpu=(8000, 16000, 32000), carbon=(300.0, 50.0, 10.0), price=(50.0, 200.0, 100.0),
             regions=(0, 0, 1)) -> ClusterFeatures:
    n = len(free_cpu)
    free = np.array(free_cpu, dtype=float)
    rtt = np.array([[2.0, 30.0], [30.0, 2.0]])
    return ClusterFeatures(
        region_index=np.array(regions), alloc_milli_cpu=np.full(n, 64000.0), alloc_memory_bytes=np.full(n, 256.0 * GIB),
        alloc_gpu=np.zeros(n), free_milli_cpu=free, free_memory_bytes=np.full(n, 128.0 * GIB), free_gpu=np.zeros(n),
        max_node_free_milli_cpu=free, max_node_free_memory_bytes=np.full(n, 128.0 * GIB), fragmentation=np.zeros(n),
        carbon_now=np.array(carbon), carbon_forecast=np.array(carbon),
        carbon_forecast_hourly=np.repeat(np.array(carbon)[:, None], 24, axis=1), price_per_mwh=np.array(price),
        pue=np.ones(n), queue_length=np.zeros(n), slo_violation_rate=np.zeros(n), ready=np.ones(n, dtype=bool),
        rtt_ms=rtt, bandwidth_gbps=np.full((2, 2), 100.0))


def workload(**kw) -> WorkloadFeatures:
    base = dict(replicas=1, milli_cpu=4000.0, memory_bytes=GIB, gpu=0.0, origin_region=-1, latency_slo_ms=0.0,
                allowed_regions=None, deferrable=False, deadline_hours=0.0, weights=(0.25, 0.25, 0.25, 0.25))
    base.update(kw)
    return WorkloadFeatures(**base)


def test_registry_lists_every_baseline() -> None:
    assert set(BASELINES) <= set(names()) and "gnn" in names()
    with pytest.raises(KeyError, match="unknown routing policy"):
        get_policy("nope")


@pytest.mark.parametrize(("policy", "expected"), [
    pytest.param("least-carbon", [2, 2, 2], id="least-carbon-always-cleanest"),
    pytest.param("least-cost", [0, 0, 0], id="least-cost-always-cheapest"),
    pytest.param("round-robin", [0, 1, 2], id="round-robin-rotates"),
    # Karmada dynamic weights = available replicas of a 4-CPU replica: 8/4=2, 16/4=4, 32/4=8 (total 14).
    # Smooth weighted round-robin: credits (2,4,8) → pick 2, pay 14 → (2,4,-6); (4,8,2) → pick 1 → (4,-6,2);
    # (6,-2,10) → pick 2.
    pytest.param("karmada", [2, 1, 2], id="karmada-weighted-by-available-replicas"),
])
def test_baseline_choices(policy: str, expected: list[int]) -> None:
    router = Router(get_policy(policy))
    c = clusters()
    got = [router.decide(lambda: c, workload()).cluster for _ in expected]
    assert got == expected


def test_karmada_shares_follow_available_replicas() -> None:
    router = Router(get_policy("karmada"))
    c = clusters()
    picks = [router.decide(lambda: c, workload()).cluster for _ in range(140)]
    # weights 2 : 4 : 8 → 20 : 40 : 80 of 140
    assert np.bincount(picks, minlength=3).tolist() == [20, 40, 80]


def test_random_is_seeded() -> None:
    c = clusters()
    a = [Router(get_policy("random", seed=3)).decide(lambda: c, workload()).cluster for _ in range(1)]
    r1, r2 = Router(get_policy("random", seed=3)), Router(get_policy("random", seed=3))
    assert [r1.decide(lambda: c, workload()).cluster for _ in range(20)] == \
        [r2.decide(lambda: c, workload()).cluster for _ in range(20)]
    assert a[0] in (0, 1, 2)


@pytest.mark.parametrize(("wl", "mask", "reason"), [
    pytest.param(workload(replicas=3), [False, True, True], "insufficient free capacity for all replicas",
                 id="capacity"),
    pytest.param(workload(allowed_regions=np.array([False, True])), [False, False, True],
                 "region not allowed (data residency)", id="residency"),
    pytest.param(workload(origin_region=0, latency_slo_ms=20.0), [True, True, False],
                 "round trip from origin exceeds the latency SLO", id="latency"),
])
def test_filter_diagnosis(wl: WorkloadFeatures, mask: list[bool], reason: str) -> None:
    got, diagnosis = feasible_mask(clusters(), wl)
    assert got.tolist() == mask
    assert diagnosis[reason] == mask.count(False)


def test_no_cluster_explains_why() -> None:
    c = clusters()
    c.ready[:] = [False, True, True]
    decision = Router(get_policy("least-carbon")).decide(lambda: c, workload(replicas=100))
    assert decision.cluster == NO_CLUSTER
    assert decision.explain(3) == "0/3 clusters available: 1 cluster not ready, 2 insufficient free capacity for all replicas"


def test_available_replicas_uses_the_scarcest_resource() -> None:
    c = clusters()
    c.free_memory_bytes[:] = [2 * GIB, 100 * GIB, 100 * GIB]
    # cpu allows 2, 4, 8; memory (1 GiB each) allows 2, 100, 100 → min
    assert available_replicas(c, workload()).tolist() == [2, 4, 8]


@pytest.mark.parametrize(("scores", "feasible", "deferrable", "expected"), [
    pytest.param([1.0, 3.0, 2.0, 5.0], [True, True, True], False, 1, id="defer-ignored-when-not-deferrable"),
    pytest.param([1.0, 3.0, 2.0, 5.0], [True, True, True], True, DEFER, id="defer-wins"),
    pytest.param([1.0, 3.0, 2.0, 0.0], [True, False, True], True, 2, id="masked-best"),
    pytest.param([1.0, 3.0, 2.0, -np.inf], [False, False, False], False, NO_CLUSTER, id="nothing-feasible"),
    pytest.param([-np.inf, -np.inf, -np.inf, -np.inf], [True, True, False], False, NO_CLUSTER,
                 id="every-feasible-ruled-out"),
    pytest.param([-np.inf, -np.inf, -np.inf, 0.0], [True, True, False], True, DEFER, id="ruled-out-defers"),
])
def test_select(scores, feasible, deferrable, expected) -> None:
    assert select(np.array(scores), np.array(feasible), deferrable) == expected


def test_stage_errors_name_the_stage() -> None:
    class Broken:
        name = "broken"

        def reset(self) -> None: ...

        def score(self, clusters, workload, feasible):
            raise ValueError("boom")

    c = clusters()
    with pytest.raises(RoutingStageError, match="'score'"):
        Router(Broken()).decide(lambda: c, workload())
    decision = Router(get_policy("least-carbon")).decide(lambda: c, workload())
    assert set(decision.stage_seconds) == {"snapshot", "filter", "score", "select"}


def test_gnn_shield_keeps_running_slos() -> None:
    from global_scheduler.routing.gnn_routing import GnnRouting
    from gnn.policy import GnnRoutingNet
    from meridian.seeding import set_random_seed

    set_random_seed(0)
    c = clusters()
    # Cluster 2 is 50 % used (32 of 64 CPU free); a running workload there breaks above 52 % utilisation.
    c.tightest_slo_utilisation = np.array([1.0, 1.0, 0.52])
    policy = GnnRouting(net=GnnRoutingNet(), shield_margin=0.1)
    scores = policy.score(c, workload(), np.ones(3, dtype=bool))
    # Cluster 2: (32 + 4) / 64 = 56 % (+10 % margin) > 52 %: ruled out. Cluster 0: (56 + 4) / 64 = 94 %
    # + 10 % > 100 %: ruled out too. Cluster 1: (48 + 4) / 64 = 81 % + 10 % ≤ 100 %: the only safe one.
    assert scores[0] == -np.inf and scores[2] == -np.inf and np.isfinite(scores[1])
    # No cluster keeps the margin, but cluster 1 breaks no SLO at 0.81 ≤ 0.85 (0 at 0.94 > 0.9 and 2 at
    # 0.56 > 0.52 would): the margin is given up there, never an SLO.
    c.tightest_slo_utilisation = np.array([0.9, 0.85, 0.52])
    scores = policy.score(c, workload(), np.ones(3, dtype=bool))
    assert np.isfinite(scores[1]) and scores[0] == -np.inf and scores[2] == -np.inf
    # Every cluster would break a running workload's SLO: the workload waits instead of breaking them.
    c.tightest_slo_utilisation = np.full(3, 0.1)
    assert (policy.score(c, workload(), np.ones(3, dtype=bool))[:3] == -np.inf).all()
    waiting = Router(policy).decide(lambda: c, workload())
    assert waiting.cluster == NO_CLUSTER
    assert "3 ruled out by gnn" in waiting.explain(3)
    assert Router(policy).decide(lambda: c, workload(deferrable=True, deadline_hours=5.0)).cluster == DEFER


def test_least_carbon_slo_is_greedy_only_where_no_slo_breaks() -> None:
    c = clusters()
    greedy, safe = Router(get_policy("least-carbon")), Router(get_policy("least-carbon-slo"))
    assert greedy.decide(lambda: c, workload()).cluster == 2 == safe.decide(lambda: c, workload()).cluster
    # A running workload on the cleanest cluster breaks above 55 %; placing 4 of 64 CPU there makes it
    # (32 + 4) / 64 = 56 %: greedy goes there anyway, the SLO-keeping variant takes the next cleanest.
    c.tightest_slo_utilisation = np.array([1.0, 1.0, 0.55])
    assert greedy.decide(lambda: c, workload()).cluster == 2
    assert safe.decide(lambda: c, workload()).cluster == 1
    # The workload's own SLO counts too: 40 ms from region 1 with a 30 ms round trip to clusters 0 and 1
    # caps them at 1 − 5 / (40 − 30) = 50 % (both are fuller), so nothing is left and it waits.
    own = workload(origin_region=1, latency_slo_ms=40.0)
    assert safe.decide(lambda: c, own).cluster == NO_CLUSTER
    c.tightest_slo_utilisation = np.ones(3)
    assert safe.decide(lambda: c, own).cluster == 2
    c.tightest_slo_utilisation = np.full(3, 0.1)
    assert safe.decide(lambda: c, workload(deferrable=True, deadline_hours=5.0)).cluster == DEFER


def test_shadow_routing_records_both_arms_on_the_same_snapshot_and_publishes_windows(redis_bus) -> None:
    from global_scheduler.routing.shadow import ShadowRouting
    from global_scheduler.routing.shadow_publisher import evaluation_publisher
    from meridian.lifecycle.records import EvaluationRecord, evaluations_stream

    publisher = evaluation_publisher(redis_bus, candidate="routing-v2", active="routing-v1", window_decisions=2)
    shadow = ShadowRouting(get_policy("least-cost"), get_policy("least-carbon"), sink=publisher)
    router = Router(shadow)
    c = clusters()
    decisions = [router.decide(lambda: c, workload()).cluster for _ in range(4)]
    assert decisions == [0, 0, 0, 0]  # least-cost serves: cluster 0 is the cheapest
    assert [(r.active_choice, r.candidate_choice) for r in shadow.records] == [(0, 2)] * 4
    assert shadow.records[0].active_carbon == 300.0 and shadow.records[0].candidate_carbon == 10.0
    windows = [EvaluationRecord.model_validate_json(e.payload) for e in redis_bus.read_range(evaluations_stream("routing"))]
    assert len(windows) == 2 and windows[0].agreed == 0.0
    assert windows[0].candidate_outcomes == {"carbon_per_replica_hour": 10.0, "slo_violations": 0.0}
    # a choice that takes its own latency SLO past the M/M/1 ceiling is a violation for that arm only: from
    # region 0 with 20 ms, the ceiling is 1 - 5 / (20 - 2) = 0.72; the cheap cluster 0 ends at 0.94
    shadow.records.clear()
    roomy = clusters(free_cpu=(8000, 60000, 32000))
    router.decide(lambda: roomy, workload(origin_region=0, latency_slo_ms=20.0))
    record = shadow.records[0]
    assert (record.active_choice, record.candidate_choice) == (0, 1)
    assert record.active_slo_violation and not record.candidate_slo_violation


def test_shadow_routing_leaves_deferrals_unpaired() -> None:
    from global_scheduler.routing.shadow import ShadowRouting

    class Defers:
        name = "defers"

        def reset(self) -> None: ...

        def score(self, clusters, workload, feasible):  # type: ignore[no-untyped-def]
            return np.append(np.zeros(clusters.n), 1.0)

    shadow = ShadowRouting(get_policy("least-carbon"), Defers())
    Router(shadow).decide(clusters, workload(deferrable=True, deadline_hours=5.0))
    assert shadow.unpaired == 1 and not shadow.records


def test_routing_policy_follows_the_registry_and_judges_its_candidate(redis_url, key_prefix, redis_bus,
                                                                     tmp_path) -> None:  # type: ignore[no-untyped-def]
    from global_scheduler.routing.gnn_routing import GnnRouting
    from global_scheduler.routing.registry_policy import policy_from_registry
    from global_scheduler.routing.shadow import ShadowRouting
    from meridian.lifecycle.records import EvaluationRecord, evaluations_stream
    from meridian.model_registry.registry import open_registry
    from tests.model_registry_helpers import register_version, routing_checkpoint

    registry = open_registry(redis_url, artifacts_dir=tmp_path / "store", key_prefix=key_prefix)

    def register(name: str, *states: str) -> str:
        return register_version(registry, "routing", routing_checkpoint(tmp_path / name), *states)

    try:
        assert policy_from_registry(registry, redis_bus).name == "least-carbon-slo"
        active = register("a.pt", "shadow", "canary", "active")
        served = policy_from_registry(registry, redis_bus)
        assert isinstance(served, GnnRouting) and served.net is not None
        candidate = register("b.pt", "shadow")
        shadow = policy_from_registry(registry, redis_bus, window_decisions=2)
        assert isinstance(shadow, ShadowRouting) and isinstance(shadow.candidate, GnnRouting)
        router = Router(shadow)
        for _ in range(4):
            router.decide(clusters, workload())
        windows = [EvaluationRecord.model_validate_json(e.payload)
                   for e in redis_bus.read_range(evaluations_stream("routing"))]
        assert len(windows) == 2 and {(w.candidate, w.active) for w in windows} == {(candidate, active)}
    finally:
        registry.close()
