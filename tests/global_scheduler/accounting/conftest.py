"""Fixtures for the accounting tests: a small simulated run on the real grid series."""

from __future__ import annotations

from pathlib import Path

import pytest

from global_scheduler.accounting.sample_run import generate_sample_run


@pytest.fixture(scope="session")
def sample_run_dir(traces_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two days, both policies (carbon-greedy primary, karmada counterfactual), hourly steps."""
    return generate_sample_run(traces_dir, tmp_path_factory.mktemp("run"), days=2, step_s=3600)
