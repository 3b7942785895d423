"""Fixtures shared by the regional tier's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meridian.model_registry.registry import ModelRegistry, open_registry


@pytest.fixture
def registry(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[ModelRegistry]:
    """A model registry on the test's Redis keys, artifacts under ``tmp_path``."""
    registry = open_registry(redis_url, artifacts_dir=tmp_path / "store", key_prefix=key_prefix)
    yield registry
    registry.close()
