"""Loaders for the real traces in ``../shared/traces`` (see its README for every column).

Where the traces are is decided in one place, :func:`locate_traces`, by one rule with no guessing:
``$MERIDIAN_TRACES`` when it is set, else ``shared/traces`` beside the project (``../shared/traces``
from the repository root, the CI layout). No other folder is tried — in particular no ancestor's
``shared/traces`` — and when the chosen folder is missing the error names both places. The first
lookup of a process logs the folder it chose at INFO, so every command says which traces it read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TRACES_ENV = "MERIDIAN_TRACES"
# The repository root: this file is <root>/meridian/traces/__init__.py.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class TraceFormatError(ValueError):
    """A trace row that cannot be read; names the file, the line and the column."""

    def __init__(self, path: Path | str, line: int, column: str, reason: str) -> None:
        self.path, self.line, self.column, self.reason = str(path), line, column, reason
        super().__init__(f"{path}:{line}: column {column!r}: {reason}")


class TracesNotFoundError(FileNotFoundError):
    """The traces folder the rule chose does not exist; the message names both places."""


@dataclass(frozen=True)
class TracesLocation:
    """The traces folder and which rule chose it (``env``: ``$MERIDIAN_TRACES``; ``project``: beside the project)."""

    path: Path
    source: str

    def describe(self) -> str:
        """One line for a command's output: the folder and why it was chosen."""
        if self.source == "env":
            return f"traces: {self.path} (from ${TRACES_ENV})"
        return f"traces: {self.path} (../shared/traces beside the project; ${TRACES_ENV} not set)"


def project_traces_dir(project_root: Path = PROJECT_ROOT) -> Path:
    return project_root.parent / "shared" / "traces"


def locate_traces(*, environ: Mapping[str, str] | None = None, project_root: Path = PROJECT_ROOT) -> TracesLocation:
    """The traces folder: ``$MERIDIAN_TRACES`` when set, else ``../shared/traces`` beside the project.

    Raises :class:`TracesNotFoundError` naming both places when the chosen folder is not a directory (a
    set but wrong ``$MERIDIAN_TRACES`` is an error, not a reason to fall back to the project's folder)."""
    env = (os.environ if environ is None else environ).get(TRACES_ENV, "")
    beside = project_traces_dir(project_root)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise TracesNotFoundError(f"${TRACES_ENV} is {env!r}, which is not a folder (the default, used only "
                                      f"when ${TRACES_ENV} is unset, is {beside}); fix or unset ${TRACES_ENV}")
        return TracesLocation(path, "env")
    if not beside.is_dir():
        raise TracesNotFoundError(f"no traces folder: ${TRACES_ENV} is not set and {beside} (../shared/traces "
                                  f"beside the project {project_root}) does not exist; set ${TRACES_ENV} to the "
                                  "folder holding the shared traces")
    return TracesLocation(beside, "project")


_logged: set[TracesLocation] = set()


def default_traces_dir() -> Path:
    """:func:`locate_traces`'s folder (raises :class:`TracesNotFoundError` when it is missing); the first
    time a process uses a folder it is logged at INFO (``traces: … (from $MERIDIAN_TRACES)``)."""
    location = locate_traces()
    if location not in _logged:
        _logged.add(location)
        log.info("%s", location.describe())
    return location.path


def missing_trace(traces_dir: Path, relative: str) -> TracesNotFoundError:
    """The error for a traces folder that exists but lacks ``relative`` (a file or a glob under it): it names
    the folder looked in and how to point to another, as :func:`locate_traces` does for a missing folder."""
    return TracesNotFoundError(f"the traces folder {traces_dir} has no {relative}; point ${TRACES_ENV} (or --traces, "
                               "where the command has it) at the folder holding the shared traces "
                               "(alibaba-gpu-v2023/, alibaba-dlrm-v2025/, carbon/, prices/)")
