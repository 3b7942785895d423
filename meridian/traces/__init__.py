"""Loaders for the real traces in ``../shared/traces`` (see its README for every column)."""

from __future__ import annotations

import os
from pathlib import Path


class TraceFormatError(ValueError):
    """A trace row that cannot be read; names the file, the line and the column."""

    def __init__(self, path: Path | str, line: int, column: str, reason: str) -> None:
        self.path, self.line, self.column, self.reason = str(path), line, column, reason
        super().__init__(f"{path}:{line}: column {column!r}: {reason}")


def default_traces_dir() -> Path:
    """``$MERIDIAN_TRACES``, else ``../shared/traces`` beside the repository (the CI layout)."""
    env = os.environ.get("MERIDIAN_TRACES")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" / "traces"
        if candidate.is_dir():
            return candidate
    return Path.cwd().parent / "shared" / "traces"
