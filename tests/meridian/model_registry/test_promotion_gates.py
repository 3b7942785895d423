"""Gate arithmetic on constructed outcome streams: promote, hold, reject, roll back (issue 26, part 2).

Run as a script to print the figures quoted in docs/drift-and-gates.md:
``.venv/bin/python tests/meridian/model_registry/test_promotion_gates.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from meridian.model_registry.gates import (
    GateDecision,
    GateSettings,
    MetricSpec,
    PromotionGate,
    RollbackDecision,
    RollbackMonitor,
    RollbackSettings,
    SequentialTestSettings,
    mixture_half_width,
    mixture_rho,
    tier_gate,
)


def paired_counts(rng: np.random.Generator, n: int, effect: float, mean: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Per-window counts (e.g. unschedulable pods) of a candidate and the active model on the same windows:
    a shared window difficulty (gamma, mean ``mean``) and Poisson outcomes; the candidate's rate is
    ``(1 + effect)`` × the active one's."""
    difficulty = rng.gamma(4.0, mean / 4.0, n)
    return rng.poisson(difficulty * (1.0 + effect)).astype(float), rng.poisson(difficulty).astype(float)


def primary_gate(margin: float = 0.02) -> PromotionGate:
    return PromotionGate([MetricSpec("unschedulable_pods", margin=margin)])


def test_normal_mixture_half_width_arithmetic() -> None:
    # n = 100, σ = 1, α = 0.05, ρ = 100: v = n + ρ = 200,
    # half-width = sqrt(2 · 200 · ln(sqrt(200 / 100) / 0.05)) / 100 = sqrt(400 · ln 28.284) / 100
    #            = sqrt(400 · 3.3423) / 100 = 0.36564
    half = mixture_half_width(np.array([100.0]), np.array([1.0]), 0.05, 100.0)
    assert half[0] == pytest.approx(0.36564, abs=1e-4)
    # ρ for optimise_at = 1000 at α = 0.05: 1000 / (2 ln 20 + ln(1 + 2 ln 20)) = 1000 / (5.9915 + 1.9447)
    assert mixture_rho(1000, 0.05) == pytest.approx(1000 / 7.9362, rel=1e-4)


@pytest.mark.parametrize(("effect", "samples", "expected"), [
    pytest.param(-0.20, 5_000, GateDecision.PROMOTE, id="clearly-better-promoted"),
    pytest.param(+0.20, 5_000, GateDecision.REJECT, id="clearly-worse-rejected"),
    pytest.param(0.0, 200, GateDecision.HOLD, id="equal-short-stream-held"),
    pytest.param(0.0, 60_000, GateDecision.PROMOTE, id="equal-long-stream-promoted-within-margin"),
])
def test_gate_decisions_on_constructed_streams(effect: float, samples: int, expected: GateDecision) -> None:
    candidate, active = paired_counts(np.random.default_rng(7), samples, effect)
    result = primary_gate().update_many({"unschedulable_pods": candidate}, {"unschedulable_pods": active})
    assert result.decision is expected, result.as_dict()
    evidence = result.evidence[0]
    assert evidence.lower <= evidence.mean_difference <= evidence.upper
    if expected is GateDecision.PROMOTE:
        assert evidence.decision_upper <= 0 and evidence.n >= SequentialTestSettings().min_samples
    if expected is GateDecision.REJECT:
        assert evidence.decision_lower > 0 and evidence.lower > 0


def test_twenty_sabotaged_candidates_are_never_promoted() -> None:
    # A subtly worse model: 10 % more unschedulable pods, five times the 2 % margin.
    decisions = []
    for seed in range(20):
        candidate, active = paired_counts(np.random.default_rng(1000 + seed), 5_000, effect=0.10)
        gate = primary_gate()
        decisions.append(gate.update_many({"unschedulable_pods": candidate},
                                          {"unschedulable_pods": active}).decision)
    assert decisions.count(GateDecision.PROMOTE) == 0
    assert decisions.count(GateDecision.REJECT) >= 18


def test_promotion_error_at_the_margin_stays_under_alpha_at_every_sample_size() -> None:
    # Candidates exactly at the margin's edge (mean 1.02 × active): the CS is time-uniform, so promoting
    # any of them at *any* point of a 3000-sample stream happens at most α = 5 % of the time.
    promoted = 0
    for seed in range(100):
        candidate, active = paired_counts(np.random.default_rng(seed), 3_000, effect=0.02)
        gate = primary_gate()
        promoted += gate.update_many({"unschedulable_pods": candidate},
                                     {"unschedulable_pods": active}).decision is GateDecision.PROMOTE
    assert promoted <= 5


def test_one_sample_at_a_time_matches_the_batch() -> None:
    candidate, active = paired_counts(np.random.default_rng(3), 2_000, effect=-0.2)
    batch = primary_gate().update_many({"unschedulable_pods": candidate}, {"unschedulable_pods": active})
    online = primary_gate()
    for c, a in zip(candidate, active, strict=True):
        result = online.update({"unschedulable_pods": float(c)}, {"unschedulable_pods": float(a)})
        if online.decided:
            break
    assert result.decision is batch.decision
    assert result.evidence[0].n == batch.evidence[0].n
    assert result.evidence[0].upper == pytest.approx(batch.evidence[0].upper)


def test_routing_slo_violations_are_a_hard_gate() -> None:
    # 30 % less carbon, but one SLO violation more than the active model at window 10: rejected there,
    # before any statistics (a hard gate needs no minimum sample).
    carbon_active = np.random.default_rng(5).normal(300.0, 20.0, 500)
    slo_candidate = np.eye(1, 500, 10).ravel()
    result = tier_gate("routing").update_many(
        {"carbon_per_replica_hour": carbon_active * 0.7, "slo_violations": slo_candidate},
        {"carbon_per_replica_hour": carbon_active, "slo_violations": np.zeros(500)})
    assert result.decision is GateDecision.REJECT and result.reason.endswith("slo_violations")
    assert result.evidence[1].n == 11 and result.evidence[1].excess_total == 1.0
    # Without the violation the same carbon saving promotes at the minimum sample.
    result = tier_gate("routing").update_many(
        {"carbon_per_replica_hour": carbon_active * 0.7, "slo_violations": np.zeros(500)},
        {"carbon_per_replica_hour": carbon_active, "slo_violations": np.zeros(500)})
    assert result.decision is GateDecision.PROMOTE and result.evidence[0].n == SequentialTestSettings().min_samples


def test_autoscaling_rejects_fewer_violations_bought_with_more_replica_hours() -> None:
    rng = np.random.default_rng(11)
    violations_c, violations_a = paired_counts(rng, 3_000, effect=-0.3)
    hours_active = rng.normal(20.0, 2.0, 3_000)
    result = tier_gate("autoscaling").update_many(
        {"slo_violation_minutes": violations_c, "replica_hours": hours_active * 1.10},
        {"slo_violation_minutes": violations_a, "replica_hours": hours_active})
    assert result.decision is GateDecision.REJECT and result.reason.endswith("replica_hours")
    assert {e.metric for e in result.evidence} == {"slo_violation_minutes", "replica_hours"}


def test_evidence_is_an_audit_record() -> None:
    candidate, active = paired_counts(np.random.default_rng(2), 1_000, effect=-0.3)
    record = primary_gate().update_many({"unschedulable_pods": candidate},
                                        {"unschedulable_pods": active}).as_dict()
    assert record["decision"] == "promote"
    (evidence,) = record["evidence"]  # type: ignore[misc]
    assert set(evidence) >= {"n", "mean_difference", "lower", "upper", "confidence", "excess_total"}
    assert evidence["confidence"] == pytest.approx(0.95)


@pytest.mark.parametrize(("effect", "expected"), [
    pytest.param(+0.30, RollbackDecision.ROLLBACK, id="bad-active-rolled-back"),
    pytest.param(-0.10, RollbackDecision.KEEP, id="good-active-kept"),
    pytest.param(0.0, RollbackDecision.KEEP, id="equal-active-kept"),
])
def test_rollback_monitor(effect: float, expected: RollbackDecision) -> None:
    settings = RollbackSettings()
    new, replaced = paired_counts(np.random.default_rng(21), 10_000, effect)
    monitor = RollbackMonitor("unschedulable_pods", settings)
    result = monitor.update_many(new, replaced)
    assert result.decision is expected, result.as_dict()
    assert result.evidence.n <= settings.max_decisions
    if expected is RollbackDecision.ROLLBACK:
        assert result.evidence.decision_lower > 0  # shown, not the deadline rule
        assert result.evidence.excess_total > 0  # the damage done before the rollback
    assert monitor.update_many(new, replaced) is result  # decisions latch


def test_rollback_monitor_decides_by_max_decisions_conservatively() -> None:
    # Exactly at the bound (10 % worse) and a short deadline: neither side is shown, so it rolls back.
    settings = RollbackSettings(max_decisions=120)
    new, replaced = paired_counts(np.random.default_rng(4), 1_000, effect=0.10)
    monitor = RollbackMonitor("unschedulable_pods", settings)
    result = monitor.update_many(new[:119], replaced[:119])
    assert result.decision is RollbackDecision.WATCH
    result = monitor.update_many(new[119:], replaced[119:])
    assert result.decision is RollbackDecision.ROLLBACK and "conservative" in result.reason
    assert result.evidence.n == 120


def test_sabotaged_model_forced_active_is_rolled_back_within_max_decisions() -> None:
    settings = RollbackSettings()
    rolled = []
    for seed in range(20):
        new, replaced = paired_counts(np.random.default_rng(500 + seed), settings.max_decisions, effect=0.5)
        result = RollbackMonitor("unschedulable_pods", settings).update_many(new, replaced)
        rolled.append((result.decision, result.evidence.n))
    assert all(d is RollbackDecision.ROLLBACK for d, _ in rolled)
    assert max(n for _, n in rolled) <= settings.max_decisions


def test_settings_read_from_the_environment_and_document_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_GATES_MARGIN", "0.05")
    monkeypatch.setenv("MERIDIAN_GATES_TEST__CONFIDENCE", "0.99")
    settings = GateSettings()
    assert settings.margin == 0.05 and settings.test.confidence == 0.99
    for model in (GateSettings, SequentialTestSettings, RollbackSettings):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"
    assert math.isclose(tier_gate("placement", settings).comparisons["unschedulable_pods"].alpha, 0.005)


def main() -> None:
    """Print the figures quoted in docs/drift-and-gates.md."""
    for effect in (-0.2, -0.1, 0.0, 0.02, 0.05, 0.1, 0.2):
        outcomes = []
        for seed in range(20):
            candidate, active = paired_counts(np.random.default_rng(2000 + seed), 60_000, effect)
            result = primary_gate().update_many({"unschedulable_pods": candidate},
                                                {"unschedulable_pods": active})
            outcomes.append((result.decision, result.evidence[0].n))
        counts = {d.value: sum(o is d for o, _ in outcomes) for d in GateDecision}
        print(f"gate, candidate {effect:+.0%}: {counts}, median n {np.median([n for _, n in outcomes]):.0f}, "
              f"max n {max(n for _, n in outcomes)}")
    for effect in (-0.1, 0.0, 0.05, 0.15, 0.3, 0.5):
        outcomes = []
        for seed in range(20):
            new, replaced = paired_counts(np.random.default_rng(3000 + seed), 10_000, effect)
            result = RollbackMonitor("unschedulable_pods").update_many(new, replaced)
            outcomes.append((result.decision, result.evidence.n, result.evidence.excess_total))
        counts = {d.value: sum(o is d for o, _, _ in outcomes) for d in RollbackDecision}
        print(f"rollback, new model {effect:+.0%}: {counts}, median n {np.median([n for _, n, _ in outcomes]):.0f}, "
              f"max n {max(n for _, n, _ in outcomes)}, median excess {np.median([x for *_, x in outcomes]):.0f}")


if __name__ == "__main__":
    main()


def test_rollback_panel_undoes_a_model_that_keeps_the_primary_but_overspends() -> None:
    """An autoscaler with fewer violations at 1.6× the replica-hours: one monitor on the primary metric would
    keep it; the tier's panel rolls it back on replica-hours, and keeps a model within bound on both."""
    from meridian.model_registry.gates import RollbackPanel, tier_rollback

    rng = np.random.default_rng(3)
    old_v, old_h = rng.poisson(4.0, 400).astype(float), rng.normal(10.0, 1.0, 400)
    overspender = {"slo_violation_minutes": 0.5 * old_v, "replica_hours": 1.6 * old_h}
    replaced = {"slo_violation_minutes": old_v, "replica_hours": old_h}
    assert RollbackMonitor("slo_violation_minutes").update_many(
        overspender["slo_violation_minutes"], old_v).decision is RollbackDecision.KEEP
    panel = tier_rollback("autoscaling")
    assert panel.metrics == ("slo_violation_minutes", "replica_hours")
    verdict = panel.update_many(overspender, replaced)
    assert verdict.decision is RollbackDecision.ROLLBACK and verdict.reason.startswith("replica_hours")
    assert verdict.evidence.n <= 100
    within = {"slo_violation_minutes": old_v, "replica_hours": 1.01 * old_h}
    kept = RollbackPanel(("slo_violation_minutes", "replica_hours")).update_many(within, replaced)
    assert kept.decision is RollbackDecision.KEEP
    with pytest.raises(ValueError, match="replica_hours"):
        RollbackPanel(("replica_hours",)).update_many({"x": [1.0]}, {"x": [1.0]})
