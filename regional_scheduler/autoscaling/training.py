"""Train the DQN on the training days of one or more series and write a checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from regional_scheduler.autoscaling.dqn.algorithm import DQN
from regional_scheduler.autoscaling.dqn.checkpoint import save_checkpoint
from regional_scheduler.autoscaling.dqn.policy import QNetwork
from regional_scheduler.autoscaling.env import AutoscaleEnv
from regional_scheduler.autoscaling.scenario import build_scenario
from regional_scheduler.autoscaling.settings import AutoscalerSettings

DEFAULT_STEPS = 40_000


def train_autoscaler(series: list[Path], *, total_steps: int = DEFAULT_STEPS, seed: int = 0,
                     out: Path | None = None, settings: AutoscalerSettings | None = None,
                     violation_penalty: float = 1.0, replica_cost: float = 1.0,
                     progress: Callable[[int, dict[str, float]], None] | None = None,
                     ) -> tuple[QNetwork, dict[str, Any]]:
    """Train on the training days of ``series`` (held-back days are never seen) and save to ``out``."""
    torch.set_num_threads(1)
    scenarios = [build_scenario(path, settings) for path in series]
    env = AutoscaleEnv(scenarios, violation_penalty=violation_penalty, replica_cost=replica_cost)
    agent = DQN(env, seed=seed)
    network = agent.learn(total_steps, progress)
    metadata: dict[str, Any] = {
        "seed": seed, "total_steps": total_steps, "violation_penalty": violation_penalty,
        "replica_cost": replica_cost,
        "series": [
            {"name": s.name, "train_minutes": [0, s.split.train_end_minute],
             "held_back_minutes": [s.split.train_end_minute, s.split.total_minutes],
             "train_days": s.split.train_days, "held_back_days": round(s.split.held_back_days, 3)}
            for s in scenarios],
    }
    if out is not None:
        save_checkpoint(out, network, metadata)
    return network, metadata
