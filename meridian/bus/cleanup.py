"""Removing what a run left in Redis: every key under its private prefix, and nothing else.

The demo, the benchmarks and the tests each run under a key prefix of their own (``demo-<id>:``,
``bench-api-<id>:``, ``test-<id>:``) so that runs sharing one Redis, in parallel too, never see each
other's streams. :func:`delete_key_prefix` removes one such prefix at the end of the run: ``SCAN``
with the prefix as a glob (its ``*?[]\\`` escaped, so ``a*:`` cannot match ``ab:``), then ``UNLINK``
in batches (freed off the server's main thread). It refuses an empty prefix or one not ending in
``:``, which would reach far beyond one run's keys.
"""

from __future__ import annotations

import redis

_GLOB_SPECIAL = frozenset("*?[]\\")


def prefix_pattern(prefix: str) -> str:
    """The ``SCAN MATCH`` pattern of every key under ``prefix`` (glob characters in it escaped)."""
    return "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in prefix) + "*"


def delete_key_prefix(client: redis.Redis, prefix: str, *, batch: int = 1000) -> int:
    """Unlink every key under ``prefix``; returns how many were removed."""
    if not prefix or not prefix.endswith(":"):
        raise ValueError(f"refusing to delete under key prefix {prefix!r}: give a run's own prefix, ending in ':'")
    removed = 0
    keys: list[bytes] = []
    for key in client.scan_iter(match=prefix_pattern(prefix), count=batch):
        keys.append(key)
        if len(keys) >= batch:
            removed += int(client.unlink(*keys))
            keys.clear()
    if keys:
        removed += int(client.unlink(*keys))
    return removed
