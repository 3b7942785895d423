"""Online evaluation against the real Redis registry, on constructed outcome streams (issue 26, part 2):
a better candidate goes shadow → canary → active; sabotaged ones are never promoted; a bad model forced active
is rolled back within the monitor's bound; every decision is in the audit stream with its evidence; the canary
split is deterministic per key and sends about its share to the candidate."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np
import pytest

from meridian.model_registry.evaluation import Arm, CanarySplit, OnlineEvaluator, Phase
from meridian.model_registry.gates import RollbackPanel, tier_gate
from meridian.model_registry.registry import ActiveVersionChangedError, ModelRegistry
from meridian.model_registry.versions import ModelState, ModelVersion

WHO = "online-evaluator@test"
CHUNK = 25  # outcomes fed per call: the gate judges each prefix, so the chunk size changes nothing but speed


def placement_outcomes(rng: np.random.Generator, n: int, effect: float, fragmentation_effect: float = 0.0,
                       *, paired: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-window outcomes of a candidate and the active model: unschedulable pods (Poisson around a shared
    window difficulty, mean 5; the candidate's rate ``(1 + effect)`` × the active one's) and GPU fragmentation
    (≈ 0.3; the candidate's ``(1 + fragmentation_effect)`` ×). ``paired``: the same windows (shadow: both
    models on the same decisions); otherwise independent windows (canary: each arm its own decisions)."""
    difficulty = rng.gamma(4.0, 1.25, n)
    other = difficulty if paired else rng.gamma(4.0, 1.25, n)
    base = 0.3 + 0.02 * rng.standard_normal(n)
    base_other = base if paired else 0.3 + 0.02 * rng.standard_normal(n)
    candidate = {"unschedulable_pods": rng.poisson(difficulty * (1.0 + effect)).astype(float),
                 "gpu_fragmentation": base * (1.0 + fragmentation_effect) + 0.005 * rng.standard_normal(n)}
    active = {"unschedulable_pods": rng.poisson(other).astype(float),
              "gpu_fragmentation": base_other + 0.005 * rng.standard_normal(n)}
    return candidate, active


def evaluator_for(registry: ModelRegistry, version: ModelVersion) -> OnlineEvaluator:
    return OnlineEvaluator(registry, "placement", version.version_id, tier_gate("placement"),
                           RollbackPanel(("unschedulable_pods",)), WHO)


def feed_paired(evaluator: OnlineEvaluator, rng: np.random.Generator, effect: float, fragmentation_effect: float,
                *, limit: int) -> int:
    """Feed paired windows while the phase stays the same; returns the windows fed."""
    phase, fed = evaluator.phase, 0
    while evaluator.phase is phase and fed < limit:
        candidate, active = placement_outcomes(rng, CHUNK, effect, fragmentation_effect)
        evaluator.observe_many(candidate, active, agreements=[True] * (CHUNK - 3) + [False] * 3)
        fed += CHUNK
    return fed


def feed_arms(evaluator: OnlineEvaluator, rng: np.random.Generator, effect: float, *, limit: int) -> int:
    """Canary: each arm's windows arrive separately, interleaved; returns the windows fed per arm."""
    fed = 0
    while evaluator.phase is Phase.CANARY and fed < limit:
        candidate, active = placement_outcomes(rng, CHUNK, effect, -0.02, paired=False)
        for i in range(CHUNK):
            evaluator.observe_arm(Arm.ACTIVE, {k: float(v[i]) for k, v in active.items()})
            evaluator.observe_arm(Arm.CANDIDATE, {k: float(v[i]) for k, v in candidate.items()})
        fed += CHUNK
    return fed


def test_a_better_candidate_goes_shadow_canary_active_and_is_kept(
        registry: ModelRegistry, register: Callable[..., ModelVersion], activate: Callable[[str], None]) -> None:
    rng = np.random.default_rng(11)
    stale = register()
    activate(stale.version_id)
    candidate = register(parent=stale.version_id)
    evaluator = evaluator_for(registry, candidate)
    assert evaluator.phase is Phase.CANDIDATE
    evaluator.enter_shadow()

    feed_paired(evaluator, rng, -0.3, -0.02, limit=5000)
    assert evaluator.phase is Phase.CANARY and registry.get(candidate.version_id).state is ModelState.CANARY
    feed_arms(evaluator, rng, -0.3, limit=5000)
    assert evaluator.phase is Phase.ACTIVE and evaluator.replaced == stale.version_id
    assert registry.active("placement").version_id == candidate.version_id  # type: ignore[union-attr]
    assert registry.get(stale.version_id).state is ModelState.RETIRED
    feed_paired(evaluator, rng, -0.3, -0.02, limit=2000)
    assert evaluator.phase is Phase.DONE and evaluator.last.decision == "keep"

    mine = [r for r in registry.audit("placement") if r.who == WHO]
    steps = [(r.version_id, r.from_state, r.to_state) for r in mine]
    assert steps == [(candidate.version_id, "candidate", "shadow"), (candidate.version_id, "shadow", "canary"),
                     (stale.version_id, "active", "retired"), (candidate.version_id, "canary", "active"),
                     (candidate.version_id, "active", "active")]
    shadow_gate, canary_gate = mine[1].evidence["gate"], mine[3].evidence["gate"]
    assert shadow_gate["decision"] == canary_gate["decision"] == "promote"
    assert mine[1].evidence["agreement"]["rate"] == pytest.approx(22 / 25)  # recorded beside the gate
    assert {e["metric"] for e in shadow_gate["evidence"]} == {"unschedulable_pods", "gpu_fragmentation"}
    pods = next(e for e in canary_gate["evidence"] if e["metric"] == "unschedulable_pods")
    # Shown no worse than 1.02 × the active model (the promote statistic's upper bound), after the minimum
    # sample; non-inferiority, not superiority: the raw difference's bound may still straddle 0.
    assert pods["decision_upper"] <= 0 and pods["n"] >= 100 and pods["mean_difference"] < 0
    assert mine[4].evidence["rollback_monitor"]["decision"] == "keep" and "keeps it" in mine[4].why


@pytest.mark.parametrize(("effect", "fragmentation_effect"), [
    pytest.param(1.0, 0.2, id="random-weights"),  # double the unschedulable pods, far more fragmentation
    pytest.param(0.1, 0.0, id="subtly-worse"),  # 10 % more unschedulable pods (e.g. trained on the wrong regime)
])
def test_a_sabotaged_candidate_is_never_promoted_in_20_injections(
        registry: ModelRegistry, register: Callable[..., ModelVersion], activate: Callable[[str], None],
        effect: float, fragmentation_effect: float) -> None:
    rng = np.random.default_rng(int(effect * 100))
    activate(register().version_id)
    decisions = []
    for _ in range(20):
        evaluator = evaluator_for(registry, register())
        evaluator.enter_shadow()
        feed_paired(evaluator, rng, effect, fragmentation_effect, limit=4000)
        assert evaluator.phase in (Phase.SHADOW, Phase.DONE)  # never canary: never promoted
        decisions.append(evaluator.last.decision)
    assert "promote" not in decisions
    assert decisions.count("reject") >= 18, decisions  # and shown worse, so retired, nearly always
    retired = [r for r in registry.audit("placement") if r.to_state == "retired" and r.who == WHO]
    assert len(retired) == decisions.count("reject")
    assert all(r.evidence["gate"]["decision"] == "reject" and r.from_state == "shadow" for r in retired)


def test_a_bad_model_forced_active_is_rolled_back_within_the_monitors_bound(
        registry: ModelRegistry, register: Callable[..., ModelVersion], activate: Callable[[str], None]) -> None:
    rng = np.random.default_rng(5)
    good, bad = register(), register()
    activate(good.version_id)
    activate(bad.version_id)  # forced past the gates by an operator
    evaluator = evaluator_for(registry, bad)
    assert evaluator.phase is Phase.ACTIVE
    fed = feed_paired(evaluator, rng, 0.5, 0.0, limit=10_000)
    monitor = evaluator.last.evidence["rollback_monitor"]
    assert evaluator.last.decision == "rollback" and evaluator.phase is Phase.DONE
    assert monitor["evidence"]["n"] <= evaluator.monitor.settings.max_decisions and fed <= 2000
    assert monitor["evidence"]["excess_total"] > 0  # the damage: extra unschedulable pods while it served
    assert registry.active("placement").version_id == good.version_id  # type: ignore[union-attr]
    last_two = registry.audit("placement", count=2)
    assert [(r.version_id, r.from_state, r.to_state) for r in last_two] == [
        (bad.version_id, "active", "retired"), (good.version_id, "retired", "active")]
    assert all(r.who == WHO and r.evidence["rollback_monitor"]["decision"] == "rollback" for r in last_two)


def test_a_rejected_canary_is_retired(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                      activate: Callable[[str], None]) -> None:
    rng = np.random.default_rng(3)
    activate(register().version_id)
    version = register()
    for state in ("shadow", "canary"):
        registry.promote(version.version_id, state, who="dana", why="looked fine offline")
    evaluator = evaluator_for(registry, version)
    feed_arms(evaluator, rng, 1.0, limit=4000)
    assert evaluator.last.decision == "reject" and registry.get(version.version_id).state is ModelState.RETIRED


def test_an_operators_move_wins_and_the_evaluator_stops(registry: ModelRegistry,
                                                        register: Callable[..., ModelVersion],
                                                        activate: Callable[[str], None]) -> None:
    rng = np.random.default_rng(9)
    activate(register().version_id)
    version = register()
    evaluator = evaluator_for(registry, version)
    evaluator.enter_shadow()
    registry.promote(version.version_id, "retired", who="dana", why="superseded")
    feed_paired(evaluator, rng, -0.3, -0.02, limit=5000)
    assert evaluator.phase is Phase.DONE and evaluator.last.decision.startswith("promote (not applied")
    assert registry.get(version.version_id).state is ModelState.RETIRED


def test_a_rollback_for_a_version_no_longer_active_is_refused(
        registry: ModelRegistry, register: Callable[..., ModelVersion], activate: Callable[[str], None]) -> None:
    first, second = register(), register()
    activate(first.version_id)
    activate(second.version_id)
    with pytest.raises(ActiveVersionChangedError, match=f"{first.version_id} is no longer active"):
        registry.rollback("placement", who="x", why="y", expected_active=first.version_id)
    assert registry.active("placement").version_id == second.version_id  # type: ignore[union-attr]


def test_the_canary_split_is_stable_per_key_and_sends_its_share() -> None:
    split = CanarySplit(0.1, salt="placement-v7")
    keys = [f"pod-{uuid.UUID(int=i)}" for i in range(20_000)]
    arms = [split.arm(k) for k in keys]
    share = arms.count(Arm.CANDIDATE) / len(keys)
    assert share == pytest.approx(0.1, abs=0.01)  # binomial sd 0.002: five of them
    again = CanarySplit(0.1, salt="placement-v7")
    assert [again.arm(k) for k in keys[:2000]] == arms[:2000]  # the same key, the same arm, every time
    # Pinned: the hash is BLAKE2b of salt and key, the same in every process (not Python's salted hash()).
    assert split.position("pod-1") == pytest.approx(CanarySplit(0.5, salt="placement-v7").position("pod-1"))
    assert round(split.position("pod-1"), 12) == PINNED_POSITION
    other = CanarySplit(0.1, salt="placement-v8")
    assert [other.arm(k) for k in keys[:2000]] != arms[:2000]  # a new candidate, a new draw of keys
    assert all(split.serves_candidate(k) == (split.position(k) < 0.1) for k in keys[:100])
    assert not any(CanarySplit(0.0).serves_candidate(k) for k in keys[:100])
    assert all(CanarySplit(1.0).serves_candidate(k) for k in keys[:100])
    with pytest.raises(ValueError, match="within"):
        CanarySplit(1.5)


PINNED_POSITION = 0.052551473319  # blake2b(b"placement-v7\x00pod-1", digest_size=8) / 2**64
