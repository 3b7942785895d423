"""A model registry on the real Redis under the test's key prefix, with a throw-away artifact store and a
stand-in validator (a JSON file with a ``layout`` field), so registry tests need no torch; the tiers' real
validators are tested next to each tier."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from meridian.bus import StreamBus
from meridian.model_registry.artifacts import FilesystemArtifactStore
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import MODEL_NAMES, DataWindow, ModelVersion

LAYOUT = "layout-v7"
WINDOW = DataWindow(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 29, tzinfo=UTC),
                    digest="ab" * 32)


class JsonLayoutValidator:
    """Accepts a JSON file whose ``layout`` is :data:`LAYOUT`; refuses others naming both layouts."""

    def validate(self, path: Path) -> dict[str, Any]:
        found = json.loads(Path(path).read_text()).get("layout")
        if found != LAYOUT:
            raise ValueError(f"feature layout {found!r} is not this build's {LAYOUT!r}")
        return {"layout": LAYOUT}


@pytest.fixture
def window() -> DataWindow:
    return WINDOW


@pytest.fixture
def artifacts_dir(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"


@pytest.fixture
def registry(redis_url: str, key_prefix: str, redis_bus: StreamBus, artifacts_dir: Path) -> Iterator[ModelRegistry]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    validators = {name: JsonLayoutValidator() for name in MODEL_NAMES}
    yield ModelRegistry(client, FilesystemArtifactStore(artifacts_dir), bus=redis_bus, key_prefix=key_prefix,
                        validators=validators, url=redis_url)
    client.close()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Callable[..., Path]:
    """A new stand-in checkpoint file (unique bytes, so a unique digest) with the given layout."""

    def make(layout: str = LAYOUT) -> Path:
        path = tmp_path / f"ckpt-{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps({"layout": layout, "weights": uuid.uuid4().hex}))
        return path

    return make


@pytest.fixture
def register(registry: ModelRegistry, checkpoint: Callable[..., Path]) -> Callable[..., ModelVersion]:
    """Register a fresh stand-in checkpoint of ``model`` (keyword arguments go to ``ModelRegistry.register``)."""

    def make(model: str = "placement", **kwargs: Any) -> ModelVersion:
        args: dict[str, Any] = {"data_window": WINDOW, "train_command": f"meridian train {model}",
                                "metrics": {"unschedulable_pods": 3.0}, "who": "alice", "why": "nightly"}
        return registry.register(model, checkpoint(), **{**args, **kwargs})

    return make


@pytest.fixture
def activate(registry: ModelRegistry) -> Callable[[str], None]:
    """Walk a candidate through shadow and canary to active."""

    def walk(version_id: str) -> None:
        for state in ("shadow", "canary", "active"):
            registry.promote(version_id, state, who="bob", why=f"to {state}")

    return walk
