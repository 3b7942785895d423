"""The placement tier's part in continual learning (``meridian bench lifecycle --scenarios placement``).

* :class:`PlacementRetrainer` searches the learned correction over FGD again from learning records
  alone: the pods and nodes of the most recent windows (:mod:`.lifecycle_windows`), replayed as episodes
  (:mod:`.lifecycle_training`), from FGD with the parent's serving settings (why not from the parent's
  weights: :func:`.lifecycle_training.restarted`).
* :class:`PlacementRegimeScenario` switches the pod list mid-run from one openb list to another (by
  default a multi-GPU list to one where every GPU pod shares a GPU, :data:`DEFAULT_REGIME`): before the
  change windows draw their pods from the old list, after it from the new one. The direction matters:
  on multi-GPU windows (~2.6 unschedulable pods each) every fine-tuned correction stayed within 0.1
  pods a window of FGD and of one another over 100–150 windows, so a change *to* them has nothing to
  learn; on shared-GPU windows the correction decides which partly used GPU a share goes to, and one
  fine-tuned on them beats one fine-tuned on multi-GPU windows. The stale model is fine-tuned on
  old-list windows only; the oracle on new-list windows drawn from a seed stream the scenario's windows
  never use. Any checkpoint's outcome on a window is its counterfactual replay of that window, cached
  by the checkpoint's bytes, since the bench asks for the active model's outcomes many times over.

The names of the regimes, window counts and training budgets are one :class:`RegimeSettings`.

The measurements behind these choices: docs/results-lifecycle.md, "How the scenarios were chosen".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from meridian.drift import TIER_FEATURES, FeatureSpec
from meridian.lifecycle.records import LearningRecord
from meridian.lifecycle.tiers import SabotageKind, TrainedModel
from meridian.model import Node, Pod
from meridian.model_registry.gates import Tier
from meridian.traces import openb
from regional_scheduler.learned import lifecycle_training as training
from regional_scheduler.learned import lifecycle_windows as lw
from regional_scheduler.learned.checkpoint import load_checkpoint
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet
from regional_scheduler.learned.policy import PlacementNet

MODEL = "placement"
SOURCE = "openb-simulated"
WINDOW_MINUTES = 5  # the records' clock: one window per five minutes
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# Seed streams apart from the scenario's windows: the windows the stale and oracle models are trained
# on, and the old-list pods FGD knows before window 0.
STALE_STREAM, ORACLE_STREAM, HISTORY_STREAM = 100_000, 200_000, 400_000


class RegimeSettings(BaseModel):
    """One regime change of the placement tier and its training budgets."""

    old_list: str = Field("multigpu50", description="openb pod list before the change (the stale model's)")
    new_list: str = Field("gpushare100", description="openb pod list after the change: every GPU pod asks "
                          "for a share of one GPU, where packing shares decides who fits and the correction "
                          "fine-tuned on it leaves ~0.9 fewer pods unschedulable per window than the stale "
                          "one (the reverse change gains nothing: on multi-GPU windows no correction beats "
                          "FGD)")
    windows: int = Field(480, ge=2, description="windows in the run: enough after the change for drift "
                         "detection (a few windows), the learner's 100 windows of the new regime before a "
                         "retrain, the gate's shadow and canary phases (≥ 100 paired windows each) and the "
                         "rollback monitor's 50 (380 windows end with the retrained model still in canary)")
    change_at: int = Field(60, ge=1, description="first window of the new list: the drift detectors' 1,440-"
                           "sample warm-up is ~22 windows of ~67 multi-GPU pods")
    nodes_per_window: int = Field(lw.NODES_PER_WINDOW, ge=2, description="GPU nodes of a window's cluster")
    training_windows: int = Field(48, ge=1, description="windows the stale, oracle and wrong-regime models "
                                  "are fine-tuned on: with a dozen, replayed in turn, the search fits those "
                                  "windows' luck and gains nothing on others")
    generations: int = Field(30, ge=1, description="ES generations of every fine-tune (each 0.7–1.3 s on one "
                             "core)")
    recent_windows: int = Field(24, ge=1, description="the retrainer's newest windows: after a drift "
                                "alert the newest windows are the regime to fit, older ones dilute it; 24 "
                                "new-regime windows gained as much as 48 (the module's table)")
    sabotage_noise: float = Field(0.3, gt=0, description="standard deviation of the noise that skews the old "
                                  "regime's model into each wrong-regime candidate (standardised head-weight "
                                  "units; random candidates draw every weight at 1)")


DEFAULT_REGIME = RegimeSettings()
# Tests: 8-node windows (~35 multi-GPU pods, ~85 shared-GPU ones; ~3× cheaper to replay), still past the
# drift detectors' 1,440-sample warm-up before the change; too small a budget for the retrain's gain to show.
QUICK_REGIME = RegimeSettings(windows=88, change_at=48, nodes_per_window=8, training_windows=8, generations=4,
                              recent_windows=8)


@cache
def _nodes() -> tuple[Node, ...]:
    return tuple(openb.load_nodes())


@cache
def _pod_list(name: str) -> tuple[Pod, ...]:
    return tuple(openb.load_pods(openb.openb_dir() / f"openb_pod_list_{name}.csv"))


def _node_gpus() -> np.ndarray:
    return np.array([n.allocatable_resources.gpu for n in _nodes()])


def _draw(pod_list: str, seed: int, first: int, count: int, nodes_per_window: int) -> list[lw.Window]:
    """``count`` windows of ``pod_list``, window ``first + j`` drawn by the generator seeded
    ``(seed, first + j)``."""
    gpus = _node_gpus()
    return [lw.draw_window(first + j, _pod_list(pod_list), gpus, np.random.default_rng((seed, first + j)),
                           nodes_per_window=nodes_per_window) for j in range(count)]


def _checkpoint_net(path: Path) -> PlacementNet:
    return load_checkpoint(path)[0][training.PROFILE]


class PlacementRetrainer:
    """Searches the correction again on the newest windows, from FGD with the parent's serving settings
    (the committed checkpoint's without a parent)."""

    def __init__(self, *, generations: int = DEFAULT_REGIME.generations,
                 recent_windows: int = DEFAULT_REGIME.recent_windows) -> None:
        self.generations = generations
        self.recent_windows = recent_windows

    def train(self, records: Sequence[LearningRecord], *, parent: Path | None, out: Path,
              seed: int) -> TrainedModel:
        ordered = sorted((r for r in records if "pod_requests" in r.data), key=lambda r: r.window)
        # The windows just before the newest ones only give FGD its target workload.
        used = ordered[-(self.recent_windows + lw.HISTORY_WINDOWS):]
        windows = [lw.decode_window(r.window, r.data) for r in used]
        start = min(lw.HISTORY_WINDOWS, max(0, len(windows) - 1))
        episodes = lw.window_episodes(windows, _nodes())[start:]
        start_net = training.base_network() if parent is None else training.restarted(_checkpoint_net(parent))
        net = training.fine_tune(start_net, episodes, seed=seed, generations=self.generations)
        first, last = used[start].window, used[-1].window
        training.write_checkpoint(net, out, trained_on=f"windows {first}-{last}", seed=seed)
        return TrainedModel(out, train_command=f"PlacementRetrainer(generations={self.generations}, "
                            f"recent_windows={self.recent_windows}).train(windows {first}-{last}, "
                            f"seed={seed})",
                            metrics={"windows": float(len(episodes)), "generations": float(self.generations)})


class PlacementRegimeScenario:
    """The pod list switches from ``settings.old_list`` to ``settings.new_list`` at ``change_at``."""

    primary_metric = lw.UNSCHEDULABLE

    def __init__(self, settings: RegimeSettings, *, seed: int) -> None:
        s = self.settings = settings
        if not 0 < s.change_at < s.windows:
            raise ValueError(f"change_at {s.change_at} must fall inside the {s.windows} windows")
        self.seed = seed
        self.name = f"placement-{s.old_list}-to-{s.new_list}"
        self.description = (f"openb pods from {s.old_list} until window {s.change_at}, then from "
                            f"{s.new_list}; each window fills {s.nodes_per_window} random GPU nodes to their "
                            "GPU capacity")
        self.windows, self.change_at = s.windows, s.change_at
        self._windows = (_draw(s.old_list, seed, 0, s.change_at, s.nodes_per_window)
                         + _draw(s.new_list, seed, s.change_at, s.windows - s.change_at, s.nodes_per_window))
        history = _draw(s.old_list, seed, HISTORY_STREAM, lw.HISTORY_WINDOWS, s.nodes_per_window)
        self._episodes = lw.window_episodes(self._windows, _nodes(),
                                            history=[p for w in history for p in w.pods])
        self._policies: dict[str, NumpyPlacementNet] = {}
        self._outcomes: dict[tuple[str, int], tuple[float, float]] = {}
        self._stale: PlacementNet | None = None

    def drift_features(self) -> tuple[FeatureSpec, ...]:
        """The pod request mix only. Each window fills its nodes from empty, so the requested share rises from
        0 to ~1 within every window: a sawtooth whose per-pod samples ADWIN cuts whenever the pods per window
        change (once before the change in the default run), not a utilisation level a cluster drifts from.
        The records still carry it for a learner that watches a cluster's real utilisation."""
        return tuple(f for f in TIER_FEATURES["placement"] if f.name == lw.POD_REQUEST_MIX)

    def records(self) -> list[LearningRecord]:
        gpus = _node_gpus()
        step = timedelta(minutes=WINDOW_MINUTES)
        return [LearningRecord(model=MODEL, window=w.index, start=EPOCH + w.index * step,
                               end=EPOCH + (w.index + 1) * step, source=SOURCE, decisions=len(w.pods),
                               features=lw.window_features(w, gpus),
                               data=lw.encode_window(w.node_index, w.pods))
                for w in self._windows]

    def outcomes(self, checkpoint: Path, windows: range) -> dict[str, np.ndarray]:
        digest = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()
        policy = self._policies.get(digest)
        if policy is None:
            policy = self._policies[digest] = NumpyPlacementNet(_checkpoint_net(checkpoint))
        values = np.empty((len(windows), 2))
        for j, w in enumerate(windows):
            key = (digest, w)
            if key not in self._outcomes:
                self._outcomes[key] = lw.episode_outcome(policy, self._episodes[w])
            values[j] = self._outcomes[key]
        return {lw.UNSCHEDULABLE: values[:, 0], lw.GPU_FRAGMENTATION: values[:, 1]}

    def _fine_tuned(self, pod_list: str, stream: int, out: Path, *, seed: int) -> TrainedModel:
        s = self.settings
        windows = _draw(pod_list, self.seed, stream, s.training_windows + lw.HISTORY_WINDOWS,
                        s.nodes_per_window)
        episodes = lw.window_episodes(windows, _nodes())[lw.HISTORY_WINDOWS:]
        net = training.fine_tune(training.base_network(), episodes, seed=seed, generations=s.generations)
        training.write_checkpoint(net, out, trained_on=f"{pod_list} windows (stream {stream})", seed=seed)
        return TrainedModel(out, train_command=f"fine_tune(FGD, {s.training_windows} {pod_list} windows, "
                            f"generations={s.generations}, seed={seed})",
                            metrics={"windows": float(s.training_windows)})

    def stale(self, out: Path) -> TrainedModel:
        model = self._fine_tuned(self.settings.old_list, STALE_STREAM, out, seed=self.seed)
        self._stale = _checkpoint_net(out)
        return model

    def oracle(self, out: Path) -> TrainedModel:
        return self._fine_tuned(self.settings.new_list, ORACLE_STREAM, out, seed=self.seed)

    def sabotage(self, kind: SabotageKind, index: int, out: Path) -> TrainedModel:
        """``random``: random head weights; ``wrong_regime``: the old regime's model (the stale one, trained
        once per scenario) skewed by small noise, distinct for each index: plausible, never fitted to the
        new regime, and no better than the stale model it comes from."""
        seed = self.seed * 1_000 + index
        if kind == "random":
            net = training.random_network(seed)
            command = f"random_network(seed={seed})"
        elif kind == "wrong_regime":
            if self._stale is None:
                scratch = out.with_name(f"{out.stem}.stale.pt")
                self.stale(scratch)
                scratch.unlink()
            assert self._stale is not None
            net = training.perturbed(self._stale, seed, scale=self.settings.sabotage_noise)
            command = f"perturbed(stale, seed={seed}, scale={self.settings.sabotage_noise})"
        else:
            raise ValueError(f"unknown sabotage kind {kind!r}; choose random or wrong_regime")
        training.write_checkpoint(net, out, trained_on=f"sabotage {kind} {index}", seed=seed)
        return TrainedModel(out, train_command=command)


class PlacementLifecycle:
    """The placement tier's declaration for ``meridian.lifecycle`` (pyproject's entry-point group).

    ``retrainer()`` takes no ``quick`` flag, so its budget follows the last scenario this object built
    (the default one before any): a quick scenario's retrains must be as quick as its windows."""

    model = MODEL
    tier: Tier = "placement"

    def __init__(self) -> None:
        self._regime = DEFAULT_REGIME

    def retrainer(self) -> PlacementRetrainer:
        return PlacementRetrainer(generations=self._regime.generations,
                                  recent_windows=self._regime.recent_windows)

    def scenario(self, *, quick: bool, seed: int) -> PlacementRegimeScenario:
        self._regime = QUICK_REGIME if quick else DEFAULT_REGIME
        return PlacementRegimeScenario(self._regime, seed=seed)
