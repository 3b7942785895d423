"""In-process ``StreamBus``: the embedded default (``meridian demo``) and the unit-test double.

Same semantics as Redis streams, kept deliberately simple: each stream is a list of entries with
monotonically increasing ids ``<ms>-<seq>`` and an offset (entries trimmed off the front); a group
holds the absolute position of the next undelivered entry and a pending table ``id -> (consumer,
delivered_at_ms)``. One lock guards everything and a condition wakes blocked readers. Time comes
from ``clock_ms`` so tests can age pending entries without sleeping.

Hazard: nothing is persisted; an in-process bus lives and dies with its process, which is why the
Redis implementation is the production one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from meridian.bus.base import (
    DEAD_LETTER_PAYLOAD_KEPT_BYTES,
    BusError,
    StreamEntry,
    dead_letter_payload,
)
from meridian.bus.streams import dead_letter_stream


@dataclass
class _Group:
    next_position: int
    pending: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> (consumer, delivered_ms)


@dataclass
class _Stream:
    entries: list[StreamEntry] = field(default_factory=list)
    offset: int = 0  # absolute position of entries[0]
    last_ms: int = 0
    last_seq: int = -1
    groups: dict[str, _Group] = field(default_factory=dict)
    by_id: dict[str, bytes] = field(default_factory=dict)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class InProcessStreamBus:
    def __init__(self, *, key_prefix: str = "", clock_ms: Callable[[], float] | None = None) -> None:
        self.key_prefix = key_prefix
        self._clock_ms = clock_ms or (lambda: time.time() * 1000)
        self._streams: dict[str, _Stream] = {}
        self._values: dict[str, bytes] = {}
        self._hashes: dict[str, dict[str, bytes]] = {}
        self._lock = threading.Lock()
        self._appended = threading.Condition(self._lock)

    # ------------------------------------------------------------------ internals
    def _stream(self, name: str) -> _Stream:
        key = self.key_prefix + name
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
        return stream

    def _append(self, stream: _Stream, payload: bytes, maxlen: int | None) -> str:
        ms = int(time.time() * 1000)
        if ms > stream.last_ms:
            stream.last_ms, stream.last_seq = ms, 0
        else:
            stream.last_seq += 1
        entry_id = f"{stream.last_ms}-{stream.last_seq}"
        stream.entries.append(StreamEntry(entry_id, bytes(payload)))
        stream.by_id[entry_id] = stream.entries[-1].payload
        if maxlen is not None and len(stream.entries) > maxlen:
            drop = len(stream.entries) - maxlen
            for old in stream.entries[:drop]:
                stream.by_id.pop(old.entry_id, None)
            del stream.entries[:drop]
            stream.offset += drop
        return entry_id

    # ------------------------------------------------------------------ StreamBus
    def publish(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        with self._appended:
            entry_id = self._append(self._stream(stream), payload, maxlen)
            self._appended.notify_all()
            return entry_id

    def publish_many(self, stream: str, payloads: Sequence[bytes], *, maxlen: int | None = None) -> int:
        with self._appended:
            target = self._stream(stream)
            for payload in payloads:
                self._append(target, payload, maxlen)
            self._appended.notify_all()
            return len(payloads)

    def ensure_group(self, stream: str, group: str, *, start_id: str = "0") -> None:
        with self._lock:
            target = self._stream(stream)
            if group in target.groups:
                return
            if start_id == "$":
                position = target.offset + len(target.entries)
            else:
                start = _id_key(start_id)
                position = target.offset + sum(1 for e in target.entries if _id_key(e.entry_id) <= start)
            target.groups[group] = _Group(next_position=position)

    def read_group(self, stream: str, group: str, consumer: str, *, count: int,
                   block_ms: int | None = None) -> list[StreamEntry]:
        deadline = time.monotonic() + (block_ms or 0) / 1000
        with self._appended:
            target = self._stream(stream)
            if group not in target.groups:  # as Redis after a restart: recreate from the start
                target.groups[group] = _Group(next_position=target.offset)
            state = target.groups[group]
            while True:
                start = max(state.next_position, target.offset) - target.offset
                batch = target.entries[start:start + count]
                if batch or not block_ms:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._appended.wait(remaining)
            now = self._clock_ms()
            for entry in batch:
                state.pending[entry.entry_id] = (consumer, now)
            state.next_position = target.offset + start + len(batch)
            return list(batch)

    def ack(self, stream: str, group: str, entry_ids: Sequence[str]) -> int:
        with self._lock:
            state = self._stream(stream).groups.get(group)
            if state is None:
                return 0
            return sum(state.pending.pop(i, None) is not None for i in entry_ids)

    def claim_stale(self, stream: str, group: str, consumer: str, *, min_idle_ms: int,
                    count: int) -> list[StreamEntry]:
        with self._lock:
            target = self._stream(stream)
            state = target.groups.get(group)
            if state is None:
                return []
            now = self._clock_ms()
            claimed: list[StreamEntry] = []
            for entry_id in sorted(state.pending, key=_id_key):
                if len(claimed) >= count:
                    break
                _, delivered = state.pending[entry_id]
                if now - delivered < min_idle_ms:
                    continue
                payload = target.by_id.get(entry_id)
                if payload is None:  # trimmed away while pending: Redis drops it from the PEL too
                    del state.pending[entry_id]
                    continue
                state.pending[entry_id] = (consumer, now)
                claimed.append(StreamEntry(entry_id, payload))
            return claimed

    def pending(self, stream: str, group: str) -> int:
        with self._lock:
            state = self._stream(stream).groups.get(group)
            return 0 if state is None else len(state.pending)

    def length(self, stream: str) -> int:
        with self._lock:
            return len(self._stream(stream).entries)

    def read_range(self, stream: str, *, count: int | None = None) -> list[StreamEntry]:
        with self._lock:
            entries = self._stream(stream).entries
            return list(entries if count is None else entries[:count])

    def read_latest(self, stream: str) -> StreamEntry | None:
        with self._lock:
            entries = self._stream(stream).entries
            return entries[-1] if entries else None

    def dead_letter(self, stream: str, entry: StreamEntry, *, reason: str, group: str = "",
                    consumer: str = "", payload_kept_bytes: int = DEAD_LETTER_PAYLOAD_KEPT_BYTES,
                    maxlen: int | None = 10_000) -> str:
        envelope = dead_letter_payload(stream, entry, reason=reason, group=group, consumer=consumer,
                                       payload_kept_bytes=payload_kept_bytes)
        return self.publish(dead_letter_stream(stream), envelope, maxlen=maxlen)

    def set_value(self, key: str, value: bytes) -> None:
        with self._lock:
            self._values[self.key_prefix + key] = bytes(value)

    def get_value(self, key: str) -> bytes | None:
        with self._lock:
            return self._values.get(self.key_prefix + key)

    def group_lag(self, stream: str, group: str) -> int | None:
        with self._lock:
            target = self._streams.get(self.key_prefix + stream)
            if target is None or group not in target.groups:
                return 0
            return max(0, target.offset + len(target.entries) - target.groups[group].next_position)

    def hash_set(self, key: str, items: Mapping[str, bytes], *, replicas: int = 0) -> None:
        with self._lock:
            self._hashes.setdefault(self.key_prefix + key, {}).update({k: bytes(v) for k, v in items.items()})

    def hash_items(self, key: str) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self._hashes.get(self.key_prefix + key, {}).items())

    def hash_delete(self, key: str, fields: Sequence[str], *, replicas: int = 0) -> None:
        with self._lock:
            target = self._hashes.get(self.key_prefix + key, {})
            for f in fields:
                target.pop(f, None)

    def delete(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._streams.pop(self.key_prefix + key, None)
                self._values.pop(self.key_prefix + key, None)
                self._hashes.pop(self.key_prefix + key, None)

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing to release; present for the protocol."""


__all__ = ["BusError", "InProcessStreamBus"]
