"""The committed generated code of every ``.proto`` is exactly what regenerating would write."""

from __future__ import annotations

from pathlib import Path

import pytest

from protos import generate

PROTO_DIR = Path(generate.__file__).resolve().parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("protos-regenerated")
    return {p.name: p.read_bytes() for p in generate.generate(out)}


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return _fresh(tmp_path_factory)


def _expected_names() -> list[str]:
    return sorted(f"{proto.stem}{suffix}" for proto in generate.proto_files() for suffix in GENERATED_SUFFIXES)


def test_every_proto_has_generated_code(regenerated: dict[str, bytes]) -> None:
    assert sorted(regenerated) == _expected_names()
    missing = [name for name in _expected_names() if not (PROTO_DIR / name).is_file()]
    assert not missing, f"generated code not committed: {missing}; run python -m protos.generate"


@pytest.mark.parametrize("name", _expected_names())
def test_committed_code_matches_a_fresh_generation(regenerated: dict[str, bytes], name: str) -> None:
    committed = PROTO_DIR / name
    assert committed.is_file(), f"{name} missing; run python -m protos.generate"
    assert committed.read_bytes() == regenerated[name], f"{name} is stale; run python -m protos.generate"


def test_no_orphaned_generated_files() -> None:
    present = sorted(p.name for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES))
    assert present == _expected_names(), "generated files without a .proto (delete them)"
