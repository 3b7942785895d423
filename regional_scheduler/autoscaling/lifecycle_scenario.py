"""The autoscaling tier's regime change for ``meridian bench lifecycle``: one deployment's traffic switches
from one shared request series to another.

Timeline of the deployment (one request rate per minute, :class:`.lifecycle_replay.Deployment`):

* ``history_days`` of the old series before window 0: the stale model's training days and the forecast's
  history (the deployment has been running; nothing of it is a scenario window);
* windows ``0 … change_at − 1``: the old series' next days;
* windows ``change_at …``: the new series from its day ``new_first_day``, rescaled so that its 99th
  percentile minute is ``new_scale`` × the old one's (the service's capacity per replica is fixed from the
  old series, so the same replicas serve both).

The old series by default is Twitter's sample stream (a dense rate with minute-level noise and bursts at
recurring clock times) and the new one Alibaba's GenAI LoRA requests (a sparse rate of a few requests a
minute, so every request is a spike of load). The oracle is fine-tuned from the stale model on the new
series' days before ``new_first_day`` (never a scenario window); wrong-regime candidates are fine-tuned
from it on a third series (Wikipedia's hourly page views: no minute noise at all), rescaled to the old
series' 99th percentile.

A short DQN fine-tune moves the policy along the violations-for-replicas trade-off by more than it improves on
it, so whether a retrain passes the gate (fewer violations at no more than 1 % more replica-hours) depends on
its seed (docs/results-lifecycle.md, "How the scenarios were chosen").

A checkpoint's outcome on a window is its counterfactual (:func:`.lifecycle_replay.window_outcomes`),
simulated per block of ``block_windows`` windows from that block's defined start state, so a window's value
depends on the checkpoint and the window only, never on which range the bench asked for; blocks are
cached by the checkpoint's sha256, since the bench asks for the active model's outcomes many times.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, Field

from meridian.drift import TIER_FEATURES, FeatureSpec
from meridian.lifecycle.records import LearningRecord
from meridian.lifecycle.tiers import SabotageKind, TrainedModel
from regional_scheduler.autoscaling.actions import N_ACTIONS
from regional_scheduler.autoscaling.dqn.checkpoint import load_checkpoint, save_checkpoint
from regional_scheduler.autoscaling.dqn.policy import QNetwork
from regional_scheduler.autoscaling.features import FEATURE_LAYOUT
from regional_scheduler.autoscaling.lifecycle_records import MODEL, encode_window, hold_last
from regional_scheduler.autoscaling.lifecycle_replay import (
    Deployment,
    deployment_scenario,
    train_on_stretch,
    window_outcomes,
)
from regional_scheduler.autoscaling.request_series import MINUTES_PER_DAY, load_request_series
from regional_scheduler.autoscaling.settings import AutoscalerSettings

EPOCH = datetime(2026, 3, 2, tzinfo=UTC)  # window 0 begins on a Monday midnight, after the history days
SOURCE = "deployment/web-frontend"
PRIMARY_METRIC = "slo_violation_minutes"


class RegimeSettings(BaseModel):
    """One regime change of the autoscaling tier and its training budgets."""

    old_series: str = Field("twitter_sample_stream_2021-08_events_per_minute",
                            description="file stem of the shared series served before the change")
    new_series: str = Field("lora_requests_per_minute",
                            description="file stem of the shared series served after the change")
    wrong_series: str = Field("wikipedia_en_2016-01_requests_per_hour",
                              description="file stem of the wrong-regime candidates' training series")
    new_scale: float = Field(1.0, gt=0, description="the new series' 99th-percentile minute relative to the "
                             "old one's (2.0: the traffic doubles as well)")
    window_minutes: int = Field(15, ge=1, description="minutes per window: one per 15 minutes, as the drift "
                                "detectors aggregate SLO violations over 15 samples")
    windows: int = Field(672, ge=2, description="windows in the run (7 days): a day's drift warm-up, a day of "
                         "the old regime, then 5 days for detection (~half a day), the learner's 100 "
                         "post-drift windows, a retrain and the gate's shadow and canary phases")
    change_at: int = Field(192, ge=1, description="first window of the new series (2 days in)")
    history_days: int = Field(7, ge=2, description="old-series days before window 0: the stale model's "
                              "training days (after the first, which only feeds the forecast)")
    new_first_day: int = Field(11, ge=2, description="the new series' day at the change; its days before "
                               "train the oracle")
    block_windows: int = Field(32, ge=1, description="windows simulated per block from a defined start state "
                               "(8 hours: the one-hour warm-up adds an eighth)")
    stale_steps: int = Field(10_000, ge=100, description="DQN steps (minutes) of the stale model's training")
    oracle_steps: int = Field(6_000, ge=100, description="DQN steps of the oracle's fine-tune from the stale")
    wrong_steps: int = Field(3_000, ge=100, description="DQN steps of the wrong-regime fine-tune from the stale")
    sabotage_noise: float = Field(1e-3, gt=0, description="standard deviation of the noise making each "
                                  "wrong-regime candidate distinct bytes (weights are ~0.1)")


DEFAULT_REGIME = RegimeSettings()
QUICK_REGIME = RegimeSettings(windows=128, change_at=48, history_days=2, block_windows=16, stale_steps=800,
                              oracle_steps=300, wrong_steps=300)


@cache
def _series_rpm(stem: str) -> np.ndarray:
    from meridian.traces import default_traces_dir

    paths = sorted((default_traces_dir() / "requests").glob(f"*/{stem}.csv"))
    if not paths:
        raise FileNotFoundError(f"no shared request series {stem}.csv under {default_traces_dir() / 'requests'}")
    return load_request_series(paths[0]).requests_per_minute


def _write(network: QNetwork, out: Path, metadata: dict[str, object]) -> None:
    save_checkpoint(Path(out), network, dict(metadata))


class AutoscalingRegimeScenario:
    """One deployment's traffic switches from ``settings.old_series`` to ``settings.new_series`` at
    ``change_at`` (see the module docstring)."""

    primary_metric = PRIMARY_METRIC

    def __init__(self, settings: RegimeSettings, *, seed: int) -> None:
        s = self.settings = settings
        if not 0 < s.change_at < s.windows or s.windows % s.block_windows:
            raise ValueError(f"change_at {s.change_at} must fall inside the {s.windows} windows, and blocks of "
                             f"{s.block_windows} must tile them")
        self.seed = seed
        self.windows, self.change_at = s.windows, s.change_at
        self.name = f"autoscaling-{s.old_series.split('_')[0]}-to-{s.new_series.split('_')[0]}"
        self.description = (f"one deployment serves {s.old_series} until window {s.change_at}, then "
                            f"{s.new_series} at {s.new_scale:g}× the old 99th-percentile rate; "
                            f"{s.window_minutes}-minute windows")
        old, new = _series_rpm(s.old_series), _series_rpm(s.new_series)
        self.history_minutes = s.history_days * MINUTES_PER_DAY
        old_minutes = self.history_minutes + s.change_at * s.window_minutes
        new_first = s.new_first_day * MINUTES_PER_DAY
        new_minutes = (s.windows - s.change_at) * s.window_minutes
        if old.size < old_minutes or new.size < new_first + new_minutes:
            raise ValueError(f"{s.old_series} or {s.new_series} is too short for {s.windows} windows")
        self.old_p99 = float(np.nanquantile(old[:self.history_minutes], 0.99))
        self.new_factor = s.new_scale * self.old_p99 / float(np.nanquantile(new[:new_first], 0.99))
        sizing = AutoscalerSettings().sizing  # the sizing rule: the old p99 minute needs 20 replicas at 60 %
        capacity = self.old_p99 / (sizing.target_utilisation * sizing.reference_replicas)
        rate = np.concatenate([old[:old_minutes], new[new_first:new_first + new_minutes] * self.new_factor])
        self.deployment = Deployment(SOURCE, EPOCH - timedelta(days=s.history_days), rate, capacity)
        self._scenario = deployment_scenario(self.deployment)
        self._networks: dict[str, QNetwork] = {}
        self._blocks: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self._trained: dict[str, QNetwork] = {}

    def drift_features(self) -> tuple[FeatureSpec, ...]:
        return tuple(f for f in TIER_FEATURES["autoscaling"] if f.name == "request_rate")

    def _window_minute(self, window: int) -> int:
        return self.history_minutes + window * self.settings.window_minutes

    def records(self) -> list[LearningRecord]:
        s = self.settings
        raw = self.deployment.requests_per_minute
        held = hold_last(raw)
        step = timedelta(minutes=s.window_minutes)
        records = []
        for w in range(s.windows):
            lo = self._window_minute(w)
            features, data = encode_window(raw[lo:lo + s.window_minutes], held[lo:lo + s.window_minutes],
                                           self.deployment.capacity_per_replica_rpm)
            records.append(LearningRecord(model=MODEL, window=w, start=EPOCH + w * step, end=EPOCH + (w + 1) * step,
                                          source=SOURCE, decisions=s.window_minutes, features=features,
                                          data=data))
        return records

    def _network(self, checkpoint: Path) -> tuple[str, QNetwork]:
        digest = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()
        if digest not in self._networks:
            self._networks[digest] = load_checkpoint(Path(checkpoint))[0]
        return digest, self._networks[digest]

    def outcomes(self, checkpoint: Path, windows: range) -> dict[str, np.ndarray]:
        if windows.step != 1 or windows.start < 0 or windows.stop > self.windows:
            raise ValueError(f"windows must be a contiguous range inside 0..{self.windows}, got {windows}")
        digest, network = self._network(checkpoint)
        s = self.settings
        per_block: list[dict[str, np.ndarray]] = []
        first_block = windows.start // s.block_windows
        for block in range(first_block, -(-windows.stop // s.block_windows)):
            key = (digest, block)
            if key not in self._blocks:
                self._blocks[key] = window_outcomes(network, self._scenario, self._window_minute(block * s.block_windows),
                                                    s.block_windows, s.window_minutes)
            per_block.append(self._blocks[key])
        skip = windows.start - first_block * s.block_windows
        return {metric: np.concatenate([b[metric] for b in per_block])[skip:skip + len(windows)]
                for metric in ("slo_violation_minutes", "replica_hours")}

    def _train(self, role: str, deployment: Deployment, *, steps: int, parent: QNetwork | None) -> QNetwork:
        """Trained once per scenario (the bench asks for the stale model at the start and again for reports)."""
        if role not in self._trained:
            scenario = deployment_scenario(deployment)
            self._trained[role] = train_on_stretch(scenario, first_minute=MINUTES_PER_DAY, steps=steps,
                                                   seed=self.seed, parent=parent)
        return self._trained[role]

    def _stale_network(self) -> QNetwork:
        d = self.deployment
        history = Deployment(d.name, d.start, d.requests_per_minute[:self.history_minutes], d.capacity_per_replica_rpm)
        return self._train("stale", history, steps=self.settings.stale_steps, parent=None)

    def stale(self, out: Path) -> TrainedModel:
        s = self.settings
        network = self._stale_network()
        _write(network, out, {"role": "stale", "series": s.old_series, "days": [1, s.history_days],
                              "steps": s.stale_steps, "seed": self.seed})
        return TrainedModel(Path(out), train_command=f"train_on_stretch({s.old_series} days 1-{s.history_days}, "
                            f"steps={s.stale_steps}, seed={self.seed})", metrics={"steps": float(s.stale_steps)})

    def _other_days(self, stem: str, days: int, factor: float) -> Deployment:
        rate = _series_rpm(stem)[:days * MINUTES_PER_DAY] * factor
        return Deployment(stem, EPOCH - timedelta(days=days), rate, self.deployment.capacity_per_replica_rpm)

    def oracle(self, out: Path) -> TrainedModel:
        s = self.settings
        deployment = self._other_days(s.new_series, s.new_first_day, self.new_factor)
        network = self._train("oracle", deployment, steps=s.oracle_steps, parent=self._stale_network())
        _write(network, out, {"role": "oracle", "series": s.new_series, "days": [1, s.new_first_day],
                              "steps": s.oracle_steps, "seed": self.seed})
        return TrainedModel(Path(out), train_command=f"train_on_stretch(stale, {s.new_series} days "
                            f"1-{s.new_first_day}, steps={s.oracle_steps}, seed={self.seed})",
                            metrics={"steps": float(s.oracle_steps)})

    def sabotage(self, kind: SabotageKind, index: int, out: Path) -> TrainedModel:
        """``random``: freshly initialised weights; ``wrong_regime``: the stale model fine-tuned on
        ``wrong_series`` (once per scenario), moved by small noise so that each index is distinct bytes."""
        s = self.settings
        seed = self.seed * 1_000 + index
        torch.manual_seed(seed)
        if kind == "random":
            network = QNetwork(len(FEATURE_LAYOUT), N_ACTIONS)
            command = f"QNetwork(seed={seed})"
        elif kind == "wrong_regime":
            wrong = _series_rpm(s.wrong_series)[:s.new_first_day * MINUTES_PER_DAY]
            factor = self.old_p99 / float(np.nanquantile(wrong, 0.99))
            base = self._train("wrong", self._other_days(s.wrong_series, wrong.size // MINUTES_PER_DAY, factor),
                               steps=s.wrong_steps, parent=self._stale_network())
            network = QNetwork(len(FEATURE_LAYOUT), N_ACTIONS)
            network.load_state_dict(base.state_dict())
            with torch.no_grad():
                for parameter in network.parameters():
                    parameter.add_(torch.randn_like(parameter) * s.sabotage_noise)
            command = f"perturbed(train_on_stretch(stale, {s.wrong_series}, steps={s.wrong_steps}), seed={seed})"
        else:
            raise ValueError(f"unknown sabotage kind {kind!r}")
        _write(network, out, {"role": f"sabotage-{kind}", "index": index, "seed": seed})
        return TrainedModel(Path(out), train_command=command, metrics={})
