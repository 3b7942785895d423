"""The registry on a real Redis: round trip, lineage, keys in one hash slot, the transition table, the one-active
invariant under concurrent promotions, rollback, audit records, bus events, the metric and artifact digests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY
from redis.crc import key_slot

from meridian.bus import StreamBus
from meridian.model_registry.artifacts import ArtifactDigestError, FilesystemArtifactStore, StoredArtifact
from meridian.model_registry.keys import EVENTS_STREAM
from meridian.model_registry.registry import ModelRegistry, NothingToRollBackError, RegistryUnavailableError
from meridian.model_registry.validators import CheckpointRefusedError
from meridian.model_registry.versions import (
    DataWindow,
    ForbiddenTransitionError,
    ModelRegistryError,
    ModelState,
    ModelVersion,
    UnknownModelError,
    UnknownVersionError,
)
from protos import models_pb2
from tests.redis_helpers import free_port


def states(registry: ModelRegistry, model: str = "placement") -> dict[str, str]:
    return {v.version_id: v.state.value for v in registry.versions(model)}


def test_round_trip_keeps_every_field(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                     window: DataWindow) -> None:
    version = register("routing", metrics={"carbon_kg_per_replica_hour": 0.21, "slo_violations": 0.0})
    assert version.version_id == "routing-v1" and version.state is ModelState.CANDIDATE
    assert version.feature_layout == {"layout": "layout-v7"}
    assert version.data_window == window and version.registered_by == "alice"
    assert len(version.artifact_digest) == 64 and version.artifact_size_bytes > 0
    assert registry.get("routing-v1") == version
    assert registry.versions("routing") == [version] and registry.versions("placement") == []
    assert registry.versions() == [version]


def test_every_key_of_a_model_is_in_one_hash_slot(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                                  activate: Callable[[str], None], key_prefix: str,
                                                  redis_url: str) -> None:
    activate(register("autoscaling").version_id)
    client = redis.Redis.from_url(redis_url)
    names = [k.decode() for k in client.scan_iter(match=f"{key_prefix}meridian:models:{{autoscaling}}:*")]
    client.close()
    assert {n.rsplit(":", 1)[1] for n in names} == {"versions", "active", "history", "seq", "audit"}
    assert len({key_slot(n.encode()) for n in names}) == 1


def test_lineage_follows_the_parent_chain(registry: ModelRegistry, register: Callable[..., ModelVersion]) -> None:
    root = register()
    child = register(parent=root.version_id)
    grandchild = register(parent=child.version_id)
    sibling = register(parent=root.version_id)
    assert [v.version_id for v in registry.lineage(grandchild.version_id)] == [
        "placement-v3", "placement-v2", "placement-v1"]
    assert registry.lineage(sibling.version_id)[-1] == root


@pytest.mark.parametrize(("parent", "error"), [
    pytest.param("placement-v9", UnknownVersionError, id="unknown-parent"),
    pytest.param("routing-v1", ModelRegistryError, id="parent-of-another-model"),
])
def test_register_refuses_a_bad_parent(registry: ModelRegistry, register: Callable[..., ModelVersion], parent: str,
                                       error: type[Exception]) -> None:
    register("routing")
    with pytest.raises(error):
        register(parent=parent)
    assert registry.versions("placement") == []


def test_register_refuses_the_same_bytes_twice(registry: ModelRegistry, checkpoint: Callable[..., Path],
                                              window: DataWindow) -> None:
    path = checkpoint()
    registry.register("placement", path, data_window=window, train_command="t", who="alice")
    with pytest.raises(ModelRegistryError, match="already registered as placement-v1"):
        registry.register("placement", path, data_window=window, train_command="t", who="alice")


def test_register_refuses_a_checkpoint_the_tier_cannot_serve(registry: ModelRegistry, window: DataWindow,
                                                            checkpoint: Callable[..., Path]) -> None:
    with pytest.raises(CheckpointRefusedError, match="placement checkpoint refused: feature layout 'layout-v6'"):
        registry.register("placement", checkpoint("layout-v6"), data_window=window, train_command="t", who="alice")
    assert registry.versions("placement") == [] and registry.audit("placement") == []


@pytest.mark.parametrize(("path", "to_state", "expected"), [
    pytest.param([], "canary", "from candidate to canary", id="candidate-skips-shadow"),
    pytest.param([], "active", "from candidate to active", id="candidate-to-active"),
    pytest.param(["shadow"], "active", "from shadow to active", id="shadow-to-active"),
    pytest.param(["shadow", "canary", "active"], "retired", "rollback", id="active-retired-alone"),
    pytest.param(["retired"], "active", "from retired to active", id="retired-to-active"),
    pytest.param(["retired"], "shadow", "from retired to shadow", id="retired-to-shadow"),
    pytest.param(["shadow"], "shadow", "from shadow to shadow", id="same-state"),
])
def test_forbidden_transitions_are_refused(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                           path: list[str], to_state: str, expected: str) -> None:
    version_id = register().version_id
    for state in path:
        registry.promote(version_id, state, who="bob", why="setup")
    before, audit_before = registry.get(version_id), registry.audit("placement")
    with pytest.raises(ForbiddenTransitionError, match=expected):
        registry.promote(version_id, to_state, who="bob", why="try")
    assert registry.get(version_id) == before and registry.audit("placement") == audit_before


def test_unknown_model_and_version(registry: ModelRegistry, register: Callable[..., ModelVersion]) -> None:
    register()
    with pytest.raises(UnknownModelError, match="unknown model 'ranking'"):
        registry.versions("ranking")
    with pytest.raises(UnknownVersionError, match=r"placement-v2.*known: placement-v1"):
        registry.promote("placement-v2", "shadow", who="bob", why="x")
    with pytest.raises(UnknownVersionError):
        registry.get("not-a-version")


def test_activating_retires_the_previous_active(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                                activate: Callable[[str], None]) -> None:
    first, second = register(), register()
    activate(first.version_id)
    for state in ("shadow", "canary"):
        registry.promote(second.version_id, state, who="bob", why="x")
    result = registry.promote(second.version_id, "active", who="bob", why="better on the gate")
    assert result.retired is not None and result.retired.version_id == first.version_id
    assert [(r.version_id, r.from_state, r.to_state) for r in result.transitions] == [
        ("placement-v1", "active", "retired"), ("placement-v2", "canary", "active")]
    assert states(registry) == {"placement-v1": "retired", "placement-v2": "active"}
    assert registry.active("placement") == result.version


def test_two_concurrent_promotions_leave_one_active(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                                    activate: Callable[[str], None]) -> None:
    activate(register().version_id)
    racers = [register().version_id for _ in range(2)]
    for version_id in racers:
        for state in ("shadow", "canary"):
            registry.promote(version_id, state, who="bob", why="x")
    for _ in range(5):  # several rounds: the transactions overlap in some of them
        start = threading.Barrier(len(racers))
        errors: list[BaseException] = []

        def promote(version_id: str, start: threading.Barrier = start, errors: list[BaseException] = errors) -> None:
            start.wait()
            try:
                registry.promote(version_id, "active", who=f"op-{version_id}", why="race")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=promote, args=(v,)) for v in racers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert errors == []  # serialised: the second activation replaces the first
        actives = [v for v, s in states(registry).items() if s == "active"]
        assert len(actives) == 1 and registry.active("placement").version_id == actives[0]
        racers = [register().version_id for _ in range(2)]
        for version_id in racers:
            for state in ("shadow", "canary"):
                registry.promote(version_id, state, who="bob", why="x")


def test_concurrent_promotions_of_one_version_succeed_once(registry: ModelRegistry,
                                                           register: Callable[..., ModelVersion]) -> None:
    version_id = register().version_id
    registry.promote(version_id, "shadow", who="bob", why="x")
    registry.promote(version_id, "canary", who="bob", why="x")
    start = threading.Barrier(6)
    outcomes: list[str] = []

    def promote() -> None:
        start.wait()
        try:
            registry.promote(version_id, "active", who="op", why="race")
            outcomes.append("ok")
        except ForbiddenTransitionError:
            outcomes.append("refused")

    threads = [threading.Thread(target=promote) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["ok"] + ["refused"] * 5
    assert [r.to_state for r in registry.audit("placement")].count("active") == 1


def test_rollback_restores_the_previous_active(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                               activate: Callable[[str], None]) -> None:
    with pytest.raises(NothingToRollBackError, match="no active version"):
        registry.rollback("placement", who="carol", why="x")
    v1, v2, v3 = register(), register(), register()
    activate(v1.version_id)
    with pytest.raises(NothingToRollBackError, match="no earlier active version"):
        registry.rollback("placement", who="carol", why="x")
    activate(v2.version_id)
    activate(v3.version_id)
    result = registry.rollback("placement", who="carol", why="regressed", evidence={"unschedulable_delta": 4})
    assert (result.version.version_id, result.retired.version_id if result.retired else None) == (
        "placement-v2", "placement-v3")
    assert states(registry) == {"placement-v1": "retired", "placement-v2": "active", "placement-v3": "retired"}
    registry.rollback("placement", who="carol", why="again")
    assert registry.active("placement").version_id == "placement-v1"
    assert states(registry)["placement-v2"] == "retired"
    with pytest.raises(NothingToRollBackError):
        registry.rollback("placement", who="carol", why="x")


def _metric(model: str, from_state: str, to_state: str) -> float:
    return REGISTRY.get_sample_value("meridian_model_transitions_total",
                                     {"model": model, "from_state": from_state, "to_state": to_state}) or 0.0


def test_each_transition_is_audited_published_and_counted(registry: ModelRegistry, redis_bus: StreamBus,
                                                          register: Callable[..., ModelVersion],
                                                          activate: Callable[[str], None]) -> None:
    counted_before = _metric("autoscaling", "canary", "active"), _metric("autoscaling", "active", "retired")
    first = register("autoscaling")
    activate(first.version_id)
    second = register("autoscaling", parent=first.version_id)
    activate(second.version_id)
    registry.rollback("autoscaling", who="carol", why="violations up", evidence={"slo_violation_minutes": 12.5})
    expected = [
        ("autoscaling-v1", "none", "candidate"), ("autoscaling-v1", "candidate", "shadow"),
        ("autoscaling-v1", "shadow", "canary"), ("autoscaling-v1", "canary", "active"),
        ("autoscaling-v2", "none", "candidate"), ("autoscaling-v2", "candidate", "shadow"),
        ("autoscaling-v2", "shadow", "canary"), ("autoscaling-v1", "active", "retired"),
        ("autoscaling-v2", "canary", "active"), ("autoscaling-v2", "active", "retired"),
        ("autoscaling-v1", "retired", "active"),
    ]
    audit = registry.audit("autoscaling")
    assert [(r.version_id, r.from_state, r.to_state) for r in audit] == expected
    assert audit[-1].who == "carol" and "violations up" in audit[-1].why
    assert audit[-1].evidence == {"slo_violation_minutes": 12.5}
    assert audit[0].who == "alice" and audit[0].evidence["artifact_sha256"] == first.artifact_digest
    assert [r.at for r in audit] == sorted(r.at for r in audit)
    assert registry.audit("autoscaling", count=2) == audit[-2:]
    events = [models_pb2.ModelTransition.FromString(e.payload) for e in redis_bus.read_range(EVENTS_STREAM)]
    assert [(e.version_id, e.from_state, e.to_state) for e in events] == expected
    assert json.loads(events[-1].evidence_json) == {"slo_violation_minutes": 12.5} and events[-1].who == "carol"
    assert _metric("autoscaling", "canary", "active") - counted_before[0] == 2
    assert _metric("autoscaling", "active", "retired") - counted_before[1] == 2


def test_the_active_checkpoint_is_the_active_versions_file(registry: ModelRegistry, checkpoint: Callable[..., Path],
                                                          activate: Callable[[str], None], window: DataWindow) -> None:
    assert registry.active_checkpoint("placement") is None
    source = checkpoint()
    version = registry.register("placement", source, data_window=window, train_command="t", who="alice")
    activate(version.version_id)
    active = registry.active_checkpoint("placement")
    assert active is not None and active[0].version_id == version.version_id
    assert active[1].read_bytes() == source.read_bytes()


def test_a_corrupted_artifact_is_refused(registry: ModelRegistry, register: Callable[..., ModelVersion],
                                        artifacts_dir: Path) -> None:
    version = register()
    assert registry.artifact_path(version.version_id).read_bytes()
    stored = FilesystemArtifactStore(artifacts_dir).path_of(version.artifact_digest)
    stored.write_bytes(stored.read_bytes().replace(b"layout", b"lay0ut"))
    with pytest.raises(ArtifactDigestError, match="corrupt"):
        registry.artifact_path(version.version_id)
    stored.unlink()
    with pytest.raises(ArtifactDigestError, match="not in the store"):
        registry.artifact_path(version.version_id)


class CorruptingStore(FilesystemArtifactStore):
    """Stores the file, then a bit flips on disk before anyone reads it back."""

    def put(self, source: Path) -> StoredArtifact:
        stored = super().put(source)
        path = self.path_of(stored.digest)
        data = bytearray(path.read_bytes())
        data[0] ^= 1
        path.write_bytes(bytes(data))
        return stored


def test_registering_reads_the_artifact_back_and_checks_its_digest(registry: ModelRegistry, artifacts_dir: Path,
                                                                   checkpoint: Callable[..., Path],
                                                                   window: DataWindow) -> None:
    registry.artifacts = CorruptingStore(artifacts_dir)
    with pytest.raises(ArtifactDigestError, match="corrupt"):
        registry.register("placement", checkpoint(), data_window=window, train_command="t", who="alice")
    assert registry.versions("placement") == []


def test_the_store_is_content_addressed_and_writes_atomically(tmp_path: Path) -> None:
    store = FilesystemArtifactStore(tmp_path / "store")
    source = tmp_path / "model.pt"
    source.write_bytes(b"weights" * 1000)
    stored = store.put(source)
    assert store.put(source) == stored and store.exists(stored.digest) and stored.size_bytes == 7000
    assert store.get(stored.digest).read_bytes() == source.read_bytes()
    assert store.get(stored.digest) == tmp_path / "store" / "sha256" / stored.digest[:2] / stored.digest
    assert not list((tmp_path / "store").rglob(".incoming-*"))
    assert not store.exists("0" * 64)


def test_unreachable_redis_is_one_clear_error(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=1)
    registry = ModelRegistry(client, FilesystemArtifactStore(tmp_path), url=url)
    with pytest.raises(RegistryUnavailableError, match=f"Redis at {url} is unreachable"):
        registry.versions("placement")
    with pytest.raises(RegistryUnavailableError):
        registry.promote("placement-v1", "shadow", who="bob", why="x")


def test_promotions_that_read_the_same_state_cannot_both_win(registry: ModelRegistry,
                                                            register: Callable[..., ModelVersion],
                                                            activate: Callable[[str], None],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Both operators read "v1 is active" before either writes (held in lockstep by a barrier): without the
    WATCH both would retire v1 and activate their own version, leaving two actives. With it the second EXEC
    fails, its promotion is judged again on the new state and replaces the first one's version."""
    activate(register().version_id)
    racers = [register().version_id for _ in range(2)]
    for version_id in racers:
        for state in ("shadow", "canary"):
            registry.promote(version_id, state, who="bob", why="x")
    original_read = registry._read
    both_read = threading.Barrier(2)
    waited = threading.local()

    def read_in_lockstep(reader: object, keys: object) -> object:
        snapshot = original_read(reader, keys)  # type: ignore[arg-type]
        if threading.current_thread().name.startswith("racer") and not getattr(waited, "done", False):
            waited.done = True
            both_read.wait(timeout=10)
        return snapshot

    monkeypatch.setattr(registry, "_read", read_in_lockstep)
    threads = [threading.Thread(target=registry.promote, args=(v, "active"), kwargs={"who": "op", "why": "race"},
                                name=f"racer-{v}") for v in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    final = states(registry)
    assert sorted(final.values()) == ["active", "retired", "retired"]
    retirements = [r.version_id for r in registry.audit("placement") if r.to_state == "retired"]
    assert sorted(retirements) == sorted(v for v, s in final.items() if s == "retired")  # each retired once
