"""Where the shared traces are: ``$MERIDIAN_TRACES``, else ``../shared/traces`` beside the project, never a guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.traces import TracesNotFoundError, locate_traces


def _layout(tmp_path: Path, *, beside: bool, ancestor: bool = False) -> Path:
    """``tmp/outer/work/main`` as the project; ``tmp/outer/work/shared/traces`` beside it when asked, and an
    ancestor's ``tmp/outer/shared/traces`` that must never be picked up."""
    project = tmp_path / "outer" / "work" / "main"
    project.mkdir(parents=True)
    if beside:
        (tmp_path / "outer" / "work" / "shared" / "traces").mkdir(parents=True)
    if ancestor:
        (tmp_path / "outer" / "shared" / "traces").mkdir(parents=True)
    return project


def test_the_environment_wins(tmp_path: Path) -> None:
    project = _layout(tmp_path, beside=True)
    chosen = tmp_path / "elsewhere"
    chosen.mkdir()
    location = locate_traces(environ={"MERIDIAN_TRACES": str(chosen)}, project_root=project)
    assert (location.path, location.source) == (chosen, "env")
    assert location.describe() == f"traces: {chosen} (from $MERIDIAN_TRACES)"


def test_else_beside_the_project(tmp_path: Path) -> None:
    project = _layout(tmp_path, beside=True)
    location = locate_traces(environ={}, project_root=project)
    assert location.path == project.parent / "shared" / "traces" and location.source == "project"
    assert location.describe().startswith(f"traces: {location.path} (../shared/traces beside the project")


def test_an_ancestors_shared_traces_is_never_used(tmp_path: Path) -> None:
    project = _layout(tmp_path, beside=False, ancestor=True)
    with pytest.raises(TracesNotFoundError) as info:
        locate_traces(environ={}, project_root=project)
    message = str(info.value)
    assert str(project.parent / "shared" / "traces") in message and "MERIDIAN_TRACES" in message
    assert str(tmp_path / "outer" / "shared" / "traces") not in message


def test_a_wrong_environment_is_an_error_naming_both_places(tmp_path: Path) -> None:
    project = _layout(tmp_path, beside=True)  # the project's folder exists, but the setting is not silently ignored
    with pytest.raises(TracesNotFoundError) as info:
        locate_traces(environ={"MERIDIAN_TRACES": str(tmp_path / "missing")}, project_root=project)
    message = str(info.value)
    assert str(tmp_path / "missing") in message and str(project.parent / "shared" / "traces") in message
    assert isinstance(info.value, FileNotFoundError)


def test_the_repository_layout(traces_dir: Path) -> None:
    assert locate_traces().path == traces_dir and (traces_dir / "carbon").is_dir()
