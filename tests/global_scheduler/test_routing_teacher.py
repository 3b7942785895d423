"""The hindsight teacher of the GNN router on a small real federation whose state the tests set: room
that frees up later, SLO ceilings that rise when their holders finish, deferral into a clean
cluster's freed room, and the charge for lowering a clean cluster's SLO ceiling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from global_scheduler.federation_sim import TRAIN_REGIONS, FederationConfig, FederationSim, _Pending
from global_scheduler.routing.feasibility import feasible_mask
from global_scheduler.routing_training import room_by_hour, teacher_scores
from meridian.routing_domain import crit_utilisation, slo_ceiling_loss

CLEAN, DIRTY = 0, 1  # region indices of eu-north and eu-central


@pytest.fixture()
def sim(traces_dir: Path) -> FederationSim:
    s = FederationSim(FederationConfig(regions=TRAIN_REGIONS, clusters=4, days=1, start="03-02"), traces_dir)
    s._reset_state()
    s.running = []
    s.tenant_good, s.tenant_total = np.zeros(len(s.tenants)), np.zeros(len(s.tenants))
    s.hour = 0
    # Cluster c is in region c: make region 0 clean and the others dirty at every hour.
    s.carbon[:] = 400.0
    s.carbon[CLEAN] = 10.0
    return s


def occupy(sim: FederationSim, cluster: int, share: float, end_h: int, *, slo: float = 0.0, origin: int = 0,
           wid: int = 10_000) -> None:
    """A running workload holding ``share`` of the cluster's CPU and memory until ``end_h``."""
    nodes = np.arange(cluster * sim.per_cluster, (cluster + 1) * sim.per_cluster)
    used = (sim.node_alloc[nodes] * share).astype(np.int64)
    used[:, 2] = 0
    sim.node_used[nodes] += used
    sim.running.append({"id": wid, "cluster": cluster, "nodes": nodes, "need": used.sum(axis=0) / len(nodes),
                        "end_h": end_h, "tenant": 0, "origin": origin, "slo": slo, "gpu": 0})


def batch(sim: FederationSim, deadline_h: float = 6.0, cpu_share: float = 0.05) -> _Pending:
    base = sim.workloads[0]
    w = type(base.w)(1, base.w.tenant, 0.0, 2.0, 1, int(sim.node_alloc[:, 0].min() * 0.5),
                     int(sim.node_alloc[:, 1].min() * 0.1), 0)
    w.replicas = max(1, int(cpu_share * sim.c_alloc[:, 0].min() / max(w.milli_cpu, 1)))
    return _Pending(w, 0, deadline_h, True, 0, 0.0, None, sim.cfg.weights_batch)


def test_room_frees_when_running_work_ends(sim: FederationSim) -> None:
    occupy(sim, CLEAN, 0.99, end_h=3)
    p = batch(sim)
    feats = sim._features(0)
    wf = sim.workload_features(p, 0, 1.0)
    room = room_by_hour(sim, feats, wf, np.arange(1, 6))
    assert not room[:2, CLEAN].any() and room[2:, CLEAN].all()  # starts 1, 2 full; from 3 on free
    assert room[:, 1:].all()  # the empty clusters have room at every hour


def test_slo_ceiling_rises_when_its_holder_ends(sim: FederationSim) -> None:
    occupy(sim, CLEAN, 0.85, end_h=100)  # long batch work at 85 %
    occupy(sim, CLEAN, 0.0, end_h=2, slo=40.0, origin=CLEAN, wid=10_001)  # a 40 ms service, ends at 2
    feats = sim._features(0)
    crit = crit_utilisation(np.array([sim.rtt[CLEAN, CLEAN]]), np.array([40.0]), sim.cfg.service_ms)[0]
    assert feats.slo_ceiling()[CLEAN] == pytest.approx(crit) and crit < 0.9
    wf = sim.workload_features(batch(sim), 0, 1.0)
    room = room_by_hour(sim, feats, wf, np.arange(1, 4))
    assert not room[0, CLEAN] and room[1:, CLEAN].all()  # at start 2 the ceiling is back to 1


def test_teacher_defers_into_freed_clean_room_and_not_past_the_deadline(sim: FederationSim) -> None:
    occupy(sim, CLEAN, 0.99, end_h=3)
    p = batch(sim, deadline_h=6.0)
    feats = sim._features(0)
    wf = sim.workload_features(p, 0, 1.0)
    feasible, _ = feasible_mask(feats, wf)
    assert not feasible[CLEAN] and feasible[1:].all()
    scores = teacher_scores(sim, feats, wf, feasible, p.w.tenant)
    assert int(np.argmax(scores)) == feats.n  # wait 3 h for the clean cluster
    # The clean room comes only after the deadline: start now on the best dirty cluster instead.
    sim.running[-1]["end_h"] = 20
    scores = teacher_scores(sim, feats, wf, feasible, p.w.tenant)
    assert int(np.argmax(scores)) in (1, 2, 3)
    # "Defer" stays a labelled (finite, losing) choice, so the network learns not to take it here.
    assert np.isfinite(scores[feats.n]) and scores[feats.n] < scores.max()
    # At the deadline the workload is no longer deferrable: no defer choice at all.
    wf.deferrable = False
    assert teacher_scores(sim, feats, wf, feasible, p.w.tenant)[feats.n] == -np.inf


def test_teacher_charges_lowering_a_clean_ceiling(sim: FederationSim, monkeypatch: pytest.MonkeyPatch) -> None:
    import global_scheduler.routing_training as rt

    # A 40 ms service from eu-west (region 2) can reach eu-north and eu-west; make eu-west as clean too.
    sim.carbon[2] = 10.0
    occupy(sim, 2, 0.5, end_h=100, slo=40.0, origin=2, wid=10_002)  # eu-west's ceiling is already that SLO's
    base = sim.workloads[0]
    w = type(base.w)(2, base.w.tenant, 0.0, 2.0, 1, 1000, 2**30, 0)
    p = _Pending(w, 0, 2.0, False, 2, 40.0, None, sim.cfg.weights_latency_sensitive)
    feats = sim._features(0)
    wf = sim.workload_features(p, 0, 1.0)
    loss = slo_ceiling_loss(feats, wf)
    assert loss[CLEAN] > 0.1 and loss[2] == 0.0  # eu-north has no SLO yet; eu-west's is already this low
    feasible, _ = feasible_mask(feats, wf)
    monkeypatch.setattr(rt, "SEGREGATION", 0.0)
    free_choice = teacher_scores(sim, feats, wf, feasible, p.w.tenant)
    monkeypatch.setattr(rt, "SEGREGATION", 4.0)
    charged = teacher_scores(sim, feats, wf, feasible, p.w.tenant)
    assert int(np.argmax(free_choice)) == CLEAN  # eu-north: same intensity, lower PUE, emptier
    assert int(np.argmax(charged)) == 2  # keeps eu-north's capacity usable by everyone
    assert charged[2] == pytest.approx(free_choice[2])


def test_validation_windows_are_neither_training_nor_evaluation() -> None:
    from global_scheduler.routing_training import TrainConfig, validation_configs

    tc, evaluation = TrainConfig(), FederationConfig()
    configs = validation_configs()
    assert {name.split("/")[0] for name in configs} == {"base", "two-per-region", "stress"}
    for cfg in configs.values():
        month = int(cfg.start.split("-")[0])
        assert month not in tc.months and month != int(evaluation.start.split("-")[0])
        assert set(cfg.regions) <= set(tc.regions)  # the evaluation's unseen regions stay unseen
        assert tc.trace_days[1] <= cfg.trace_offset_days
        assert cfg.trace_offset_days + cfg.days <= evaluation.trace_offset_days
        assert all(year in tc.years for year in cfg.region_years.values())
