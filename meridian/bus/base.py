"""The ``StreamBus`` protocol every implementation satisfies (checked by one contract suite).

Semantics, shared by the Redis and in-process implementations:

* ``publish``/``publish_many`` append one entry per payload, trimming the stream to about
  ``maxlen`` entries (approximate, as ``XADD MAXLEN ~``: never shorter than asked).
* A consumer group delivers each entry to one consumer of the group; it stays *pending* for that
  consumer until acknowledged. ``claim_stale`` moves entries pending longer than ``min_idle_ms``
  to the calling consumer (``XAUTOCLAIM``), which is how a live consumer takes over a dead one's work.
* ``dead_letter`` parks an entry with the reason on ``<stream>:dead`` as a ``DeadLetter`` proto.
* Connection failures raise :class:`BusUnavailableError`; callers back off and retry (a group that
  vanished with a restarted server is recreated transparently on the next read).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from protos import telemetry_pb2

#: Name of the single field carrying the protobuf payload in every stream entry.
PAYLOAD_FIELD = "p"
#: How much of a dead-lettered payload is kept by default (enough to debug, bounded memory).
DEAD_LETTER_PAYLOAD_KEPT_BYTES = 4096


class BusError(RuntimeError):
    """A bus operation failed for a reason other than connectivity."""


class BusUnavailableError(BusError):
    """The bus cannot be reached now (server down, connection reset, timeout); retry with back-off."""


class BusAuthenticationError(BusUnavailableError):
    """Redis refused this process's credentials (wrong password, unknown or disabled ACL user, none given).

    A kind of :class:`BusUnavailableError` so loops that back off keep doing so: the server's ACL may be
    fixed, or the user created, while the process waits. The message names the user, never the password."""


class BusConfigError(BusError, ValueError):
    """The bus cannot be set up as configured (a malformed URL, an unreadable password or TLS file)."""


class BusPermissionError(BusError):
    """The ACL user may not run this command on this key (Redis ``NOPERM``): a deployment error, not an outage."""


class StreamEntry(NamedTuple):
    entry_id: str
    payload: bytes


@runtime_checkable
class StreamBus(Protocol):
    def publish(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str: ...

    def publish_many(self, stream: str, payloads: Sequence[bytes], *, maxlen: int | None = None) -> int: ...

    def ensure_group(self, stream: str, group: str, *, start_id: str = "0") -> None: ...

    def read_group(self, stream: str, group: str, consumer: str, *, count: int,
                   block_ms: int | None = None) -> list[StreamEntry]: ...

    def ack(self, stream: str, group: str, entry_ids: Sequence[str]) -> int: ...

    def claim_stale(self, stream: str, group: str, consumer: str, *, min_idle_ms: int,
                    count: int) -> list[StreamEntry]: ...

    def pending(self, stream: str, group: str) -> int: ...

    def length(self, stream: str) -> int: ...

    def group_lag(self, stream: str, group: str) -> int | None:
        """Entries not yet delivered to ``group`` (0 if the group does not exist); None when the server
        cannot tell (Redis after entries were deleted from the middle of the stream)."""
        ...

    def read_range(self, stream: str, *, count: int | None = None) -> list[StreamEntry]: ...

    def read_latest(self, stream: str) -> StreamEntry | None: ...

    def dead_letter(self, stream: str, entry: StreamEntry, *, reason: str, group: str = "",
                    consumer: str = "", payload_kept_bytes: int = DEAD_LETTER_PAYLOAD_KEPT_BYTES,
                    maxlen: int | None = 10_000) -> str: ...

    def set_value(self, key: str, value: bytes) -> None: ...

    def get_value(self, key: str) -> bytes | None: ...

    def hash_set(self, key: str, items: Mapping[str, bytes], *, replicas: int = 0) -> None:
        """Set fields of the hash ``key`` in one round trip (durable records, e.g. accepted workloads).

        ``replicas`` > 0: return only once that many replicas hold the write (``WAIT``), else raise
        :class:`BusUnavailableError` without acknowledging it (an in-process bus has no replicas: ignored)."""
        ...

    def hash_items(self, key: str) -> list[tuple[str, bytes]]:
        """Every (field, value) of the hash ``key``; empty if it does not exist."""
        ...

    def hash_delete(self, key: str, fields: Sequence[str], *, replicas: int = 0) -> None:
        """Remove fields of the hash ``key`` (absent ones are ignored); ``replicas`` as for :meth:`hash_set`."""
        ...

    def delete(self, *keys: str) -> None: ...

    def ping(self) -> bool: ...

    def close(self) -> None: ...


def dead_letter_payload(stream: str, entry: StreamEntry, *, reason: str, group: str, consumer: str,
                        payload_kept_bytes: int) -> bytes:
    """The ``DeadLetter`` envelope both implementations store."""
    return telemetry_pb2.DeadLetter(
        stream=stream, entry_id=entry.entry_id, group=group, consumer=consumer, reason=reason,
        payload=entry.payload[:payload_kept_bytes], payload_size_bytes=len(entry.payload),
        dead_lettered_unix_ms=int(time.time() * 1000),
    ).SerializeToString()
