"""Checkpoint files, addressed by the sha256 of their bytes.

:class:`ArtifactStore` is the one interface the registry needs (``put``/``get``/``exists`` by digest), so an
object store can stand in for the filesystem. :class:`FilesystemArtifactStore` keeps each file at
``<root>/sha256/<first two hex digits>/<digest>``; a write goes to a temporary file in the same folder, is
flushed to disk and renamed over the final name, so a reader sees the whole file or none. ``get`` hashes the
file again before handing out its path: a file changed on disk after it was stored is refused
(:class:`ArtifactDigestError`), never served as the version it claims to be.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from meridian.model_registry.versions import ModelRegistryError

_CHUNK_BYTES = 1 << 20


class ArtifactDigestError(ModelRegistryError):
    """An artifact is missing or its bytes no longer hash to the digest it is stored under."""


@dataclass(frozen=True)
class StoredArtifact:
    digest: str
    size_bytes: int


@runtime_checkable
class ArtifactStore(Protocol):
    def put(self, source: Path) -> StoredArtifact:
        """Store the file's bytes under their sha256; storing the same bytes twice is a no-op."""
        ...

    def get(self, digest: str) -> Path:
        """A local path to the artifact, its bytes checked against ``digest``; raises :class:`ArtifactDigestError`."""
        ...

    def exists(self, digest: str) -> bool: ...


def file_digest(path: Path) -> StoredArtifact:
    """The sha256 (hex) and size of a file, read in chunks."""
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            sha.update(chunk)
            size += len(chunk)
    return StoredArtifact(sha.hexdigest(), size)


class FilesystemArtifactStore:
    """Content-addressed files under ``root`` (created when first written)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser()

    def path_of(self, digest: str) -> Path:
        return self.root / "sha256" / digest[:2] / digest

    def exists(self, digest: str) -> bool:
        return self.path_of(digest).is_file()

    def put(self, source: Path) -> StoredArtifact:
        source = Path(source)
        if not source.is_file():
            raise ArtifactDigestError(f"no checkpoint file at {source}")
        target_dir = self.root / "sha256"
        target_dir.mkdir(parents=True, exist_ok=True)
        sha = hashlib.sha256()
        size = 0
        fd, temp_name = tempfile.mkstemp(prefix=".incoming-", dir=target_dir)
        try:
            with os.fdopen(fd, "wb") as out, source.open("rb") as handle:
                while chunk := handle.read(_CHUNK_BYTES):
                    sha.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            stored = StoredArtifact(sha.hexdigest(), size)
            final = self.path_of(stored.digest)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp_name, final)  # atomic on one filesystem: readers see all of it or nothing
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise
        return stored

    def get(self, digest: str) -> Path:
        path = self.path_of(digest)
        if not path.is_file():
            raise ArtifactDigestError(f"artifact sha256:{digest} is not in the store at {self.root}")
        found = file_digest(path)
        if found.digest != digest:
            raise ArtifactDigestError(f"artifact {path} is corrupt: its bytes hash to sha256:{found.digest}, "
                                      f"not sha256:{digest}; restore it from a backup or register the checkpoint "
                                      "again")
        return path
