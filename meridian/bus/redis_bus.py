"""``StreamBus`` over Redis streams (redis-py), the production fabric.

Design
------
* One entry per message, the protobuf bytes in field ``p``. ``publish_many`` writes a pipelined
  batch of ``XADD … MAXLEN ~ n * p <payload>`` commands, packed by hand into one buffer and sent on
  a dedicated socket (redis-py's generic pipeline builds a Python object per command and parses
  each reply in Python, several times what Redis needs to execute it); every reply is consumed in
  bulk, so a per-entry error never desynchronises the connection and is reported.
* The hot read, ``XREADGROUP``, goes through :class:`~meridian.bus.resp.RespSocket`, a one-pass
  RESP2 reader on its own socket (redis-py's pure-Python parser costs ~7 µs per entry); other
  commands use redis-py's pooled connections without its response callbacks (which build a dict per
  entry), accepting both RESP2 and RESP3 reply shapes.
* All three connections come from one :class:`~meridian.bus.connection.RedisEndpoint`: the URL plus
  ``MERIDIAN_REDIS_*`` (ACL user, password file, TLS files), so ``rediss://`` and a password reach the
  hand-written sockets as well as redis-py's. Messages print the URL without its password.
* A refused password raises :class:`BusAuthenticationError` and a command the ACL user may not run
  (``NOPERM``) :class:`BusPermissionError`, each one line naming the user, the command and the key.
* Consumer groups are created with ``MKSTREAM`` from id ``0``. When a read finds ``NOGROUP`` — the
  server restarted without persistence, or the stream was deleted — the group is recreated from
  ``0`` and the read retried, so nothing published after the restart is skipped.

Hazards
-------
* Connection failures surface as :class:`BusUnavailableError` at once (redis-py's own retries are
  off): the caller owns the back-off so an agent can buffer and a consumer can keep its state.
* ``MAXLEN ~`` trims whole macro-nodes, so a stream may hold somewhat more than ``maxlen``; entries
  trimmed while still pending are lost to ``XAUTOCLAIM`` (Redis reports them as deleted). Size
  ``maxlen`` to several consumer batches per agent interval.
* A blocking ``XREADGROUP`` must return before ``socket_timeout_s``; ``block_ms`` is capped below it.
* Threads sharing one bus share its reader socket, and a blocking read holds it for its whole
  ``BLOCK``: the socket's lock is first come, first served (:class:`_FifoLock`), so a consumer looping
  on blocking reads cannot starve another thread's reads and acknowledgements (with a plain lock it
  re-took the lock before the woken waiter ran: seconds, on a loaded machine, per read or ack).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from meridian.bus.base import (
    DEAD_LETTER_PAYLOAD_KEPT_BYTES,
    PAYLOAD_FIELD,
    BusAuthenticationError,
    BusError,
    BusPermissionError,
    BusUnavailableError,
    StreamEntry,
    dead_letter_payload,
)
from meridian.bus.connection import RedisSecuritySettings, endpoint_from_url
from meridian.bus.resp import RespAuthError, RespError, RespSocket
from meridian.bus.streams import dead_letter_stream

_PAYLOAD_FIELD_BYTES = PAYLOAD_FIELD.encode()
_CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
#: Entries per packed write in ``publish_many``: large enough to amortise the round trip, small
#: enough that the replies (about 20 bytes each) never fill a socket buffer while we still write.
PIPELINE_CHUNK = 2000


class _FifoLock:
    """A lock granted in the order it was asked for: the holder hands it to the oldest waiter."""

    def __init__(self) -> None:
        self._state = threading.Lock()
        self._held = False
        self._waiters: deque[threading.Lock] = deque()

    def __enter__(self) -> _FifoLock:
        with self._state:
            if not self._held:
                self._held = True
                return self
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        turn.acquire()  # released by the holder as it hands the lock over
        return self

    def __exit__(self, *exc: object) -> None:
        with self._state:
            if self._waiters:
                self._waiters.popleft().release()  # still held: now by the oldest waiter
            else:
                self._held = False


def _entries(raw: Any) -> list[StreamEntry]:
    """Stream entries from a raw ``[[id, [field, value, …]], …]`` reply (deleted ones skipped)."""
    out: list[StreamEntry] = []
    append = out.append
    for entry_id, fields in raw or ():
        if not fields:
            continue
        if fields[0] == _PAYLOAD_FIELD_BYTES:
            payload = fields[1]
        else:
            pairs = dict(zip(fields[::2], fields[1::2], strict=False))
            payload = pairs.get(_PAYLOAD_FIELD_BYTES, b"")
        append(StreamEntry(entry_id.decode() if isinstance(entry_id, bytes) else entry_id, payload))
    return out


class RedisStreamBus:
    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, key_prefix: str = "",
                 socket_timeout_s: float = 5.0, connect_timeout_s: float = 1.0,
                 max_connections: int = 16, security: RedisSecuritySettings | None = None,
                 wait_timeout_ms: int = 2000) -> None:
        """``security`` None: the ACL user, password and TLS files from ``MERIDIAN_REDIS_*`` (then the URL).
        ``wait_timeout_ms``: how long a durable write (``replicas`` > 0) waits for its replicas."""
        self._endpoint = endpoint_from_url(url, security if security is not None else RedisSecuritySettings())
        #: The URL without its password: what messages and logs print.
        self.url = self._endpoint.redacted_url
        self.user = self._endpoint.user
        self.key_prefix = key_prefix
        self.socket_timeout_s = socket_timeout_s
        self.wait_timeout_ms = wait_timeout_ms
        self._client = redis.Redis(
            **self._endpoint.redis_kwargs(), socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s, retry=Retry(NoBackoff(), 0), max_connections=max_connections,
            decode_responses=False,
        )
        self._pool = self._client.connection_pool
        # The hot read goes through a minimal RESP reader on its own socket.
        self._reader = RespSocket(self._endpoint, timeout_s=socket_timeout_s, connect_timeout_s=connect_timeout_s)
        self._reader_lock = _FifoLock()  # not threading.Lock: see Hazards
        # Publishing gets its own socket so a blocking read never holds up a publish.
        self._writer = RespSocket(self._endpoint, timeout_s=socket_timeout_s, connect_timeout_s=connect_timeout_s)
        self._writer_lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing
    def _key(self, name: str) -> bytes:
        return (self.key_prefix + name).encode()

    def _refused(self, reply: str, command: str, key: bytes | str | None = None) -> BusError:
        """The bus error for an error reply: ``NOPERM`` and ``NOAUTH``/``WRONGPASS`` name the user and command."""
        target = f" on {key.decode(errors='replace') if isinstance(key, bytes) else key}" if key else ""
        if reply.startswith("NOPERM"):
            return BusPermissionError(f"redis user {self.user!r} may not {command}{target} at {self.url}: {reply} "
                                      "(ACL users and what each may reach: deploy/redis/users.acl)")
        if reply.startswith(("NOAUTH", "WRONGPASS")):
            return self._auth_failed(reply)
        return BusError(f"{command}{target}: {reply}")

    def _auth_failed(self, reason: object) -> BusAuthenticationError:
        # The same words whichever socket heard them (redis-py drops the reply's WRONGPASS/NOAUTH code).
        text = str(reason).removeprefix(f"redis at {self.url} refused user {self.user!r}: ")
        text = text.removeprefix("WRONGPASS ").removeprefix("NOAUTH ")
        given = "" if self._endpoint.password else "no password is given; "
        return BusAuthenticationError(f"redis at {self.url} refused user {self.user!r}: {given}{text} (credentials: "
                                      "the URL, MERIDIAN_REDIS_USERNAME, MERIDIAN_REDIS_PASSWORD_FILE)")

    def _call(self, *args: Any) -> Any:
        """One command on a pooled connection, raw reply (no response callbacks)."""
        return self._call_pair(args)[0]

    def _call_pair(self, *commands: Sequence[Any]) -> list[Any]:
        """Commands sent back to back on one pooled connection, raw replies (no response callbacks)."""
        args = commands[0]
        try:
            conn = self._pool.get_connection()
        except redis.exceptions.AuthenticationError as exc:
            raise self._auth_failed(exc) from None
        except _CONNECTION_ERRORS as exc:
            raise BusUnavailableError(f"redis at {self.url} unreachable: {exc}") from exc
        replies: list[Any] = []
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            for command in commands:
                args = command
                replies.append(conn.read_response())
            return replies
        except redis.exceptions.ResponseError as exc:
            if len(replies) + 1 < len(commands):
                conn.disconnect()  # the later replies are still unread: never hand this connection out again
            if isinstance(exc, redis.exceptions.NoPermissionError):
                raise self._refused(f"NOPERM {exc}", *_command_and_key(args)) from None
            raise
        except redis.exceptions.AuthenticationError as exc:
            conn.disconnect()
            raise self._auth_failed(exc) from None
        except _CONNECTION_ERRORS as exc:
            conn.disconnect()
            raise BusUnavailableError(f"redis at {self.url}: {exc}") from exc
        finally:
            self._pool.release(conn)

    # ------------------------------------------------------------------ StreamBus
    def publish(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        trim = ("MAXLEN", "~", maxlen) if maxlen is not None else ()
        reply = self._call("XADD", self._key(stream), *trim, "*", PAYLOAD_FIELD, payload)
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def publish_many(self, stream: str, payloads: Sequence[bytes], *, maxlen: int | None = None) -> int:
        if not payloads:
            return 0
        key = self._key(stream)
        with self._writer_lock:
            try:
                errors = self._writer.xadd_many(key, list(payloads), maxlen=maxlen, chunk=PIPELINE_CHUNK)
            except RespAuthError as exc:
                raise self._auth_failed(exc) from None
            except (OSError, ConnectionError, ValueError) as exc:
                raise BusUnavailableError(f"redis at {self.url}: {exc}") from exc
        if errors:
            if errors[0].startswith(("NOPERM", "NOAUTH", "WRONGPASS")):
                raise self._refused(errors[0], "XADD", key)
            raise BusError(f"{len(errors)} of {len(payloads)} XADD failed on {stream}: {errors[0]}")
        return len(payloads)

    def ensure_group(self, stream: str, group: str, *, start_id: str = "0") -> None:
        try:
            self._call("XGROUP", "CREATE", self._key(stream), group, start_id, "MKSTREAM")
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise BusError(str(exc)) from exc

    def read_group(self, stream: str, group: str, consumer: str, *, count: int,
                   block_ms: int | None = None) -> list[StreamEntry]:
        block: tuple[Any, ...] = ()
        if block_ms:
            block = ("BLOCK", min(int(block_ms), int(self.socket_timeout_s * 1000) - 500))
        key = self._key(stream)
        block_ms = block[1] if block else None
        with self._reader_lock:
            for attempt in range(2):
                try:
                    return self._reader.xreadgroup(key, group, consumer, count=count, block_ms=block_ms)
                except RespError as exc:
                    if "NOGROUP" not in str(exc) or attempt:
                        raise self._refused(str(exc), "XREADGROUP", key) from None
                    self.ensure_group(stream, group, start_id="0")
                except RespAuthError as exc:
                    raise self._auth_failed(exc) from None
                except (OSError, ConnectionError, ValueError) as exc:
                    raise BusUnavailableError(f"redis at {self.url}: {exc}") from exc
        return []

    def ack(self, stream: str, group: str, entry_ids: Sequence[str]) -> int:
        if not entry_ids:
            return 0
        key = self._key(stream)
        with self._reader_lock:
            try:
                return self._reader.xack(key, group, list(entry_ids))
            except RespError as exc:
                raise self._refused(str(exc), "XACK", key) from None
            except RespAuthError as exc:
                raise self._auth_failed(exc) from None
            except (OSError, ConnectionError, ValueError) as exc:
                raise BusUnavailableError(f"redis at {self.url}: {exc}") from exc

    def claim_stale(self, stream: str, group: str, consumer: str, *, min_idle_ms: int,
                    count: int) -> list[StreamEntry]:
        claimed: list[StreamEntry] = []
        cursor: Any = "0-0"
        while len(claimed) < count:
            try:
                reply = self._call("XAUTOCLAIM", self._key(stream), group, consumer, int(min_idle_ms), cursor,
                                   "COUNT", count - len(claimed))
            except redis.exceptions.ResponseError as exc:
                if "NOGROUP" in str(exc):
                    return claimed
                raise BusError(str(exc)) from exc
            cursor, entries = reply[0], reply[1]
            claimed.extend(_entries(entries))
            if cursor in (b"0-0", "0-0"):
                break
        return claimed

    def pending(self, stream: str, group: str) -> int:
        try:
            reply = self._call("XPENDING", self._key(stream), group)
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" in str(exc):
                return 0
            raise BusError(str(exc)) from exc
        return int(reply[0])

    def group_lag(self, stream: str, group: str) -> int | None:
        try:
            reply = self._call("XINFO", "GROUPS", self._key(stream))
        except redis.exceptions.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return 0
            raise BusError(str(exc)) from exc
        for flat in reply or ():
            info = flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=False))
            if info.get(b"name") == group.encode():
                lag = info.get(b"lag")  # Redis >= 7.0; nil when it cannot be computed
                return None if lag is None else int(lag)
        return 0

    def length(self, stream: str) -> int:
        return int(self._call("XLEN", self._key(stream)))

    def read_range(self, stream: str, *, count: int | None = None) -> list[StreamEntry]:
        extra = ("COUNT", count) if count is not None else ()
        return _entries(self._call("XRANGE", self._key(stream), "-", "+", *extra))

    def read_latest(self, stream: str) -> StreamEntry | None:
        entries = _entries(self._call("XREVRANGE", self._key(stream), "+", "-", "COUNT", 1))
        return entries[0] if entries else None

    def dead_letter(self, stream: str, entry: StreamEntry, *, reason: str, group: str = "",
                    consumer: str = "", payload_kept_bytes: int = DEAD_LETTER_PAYLOAD_KEPT_BYTES,
                    maxlen: int | None = 10_000) -> str:
        envelope = dead_letter_payload(stream, entry, reason=reason, group=group, consumer=consumer,
                                       payload_kept_bytes=payload_kept_bytes)
        trim = ("MAXLEN", "~", maxlen) if maxlen is not None else ()
        # The reason also as a plain field so `redis-cli XRANGE …:dead - +` is readable.
        reply = self._call("XADD", self._key(dead_letter_stream(stream)), *trim, "*", PAYLOAD_FIELD, envelope,
                           "reason", reason)
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def set_value(self, key: str, value: bytes) -> None:
        self._call("SET", self._key(key), value)

    def get_value(self, key: str) -> bytes | None:
        return self._call("GET", self._key(key))

    def hash_set(self, key: str, items: Mapping[str, bytes], *, replicas: int = 0) -> None:
        if items:
            self._durable(replicas, "HSET", self._key(key), *(x for kv in items.items() for x in kv))

    def hash_items(self, key: str) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        cursor: bytes | int = 0
        while True:  # HSCAN, not HGETALL: a large store must not block Redis in one reply
            cursor, flat = self._call("HSCAN", self._key(key), cursor, "COUNT", 1000)
            out.extend((f.decode(), v) for f, v in zip(flat[::2], flat[1::2], strict=True))
            if cursor in (b"0", 0):
                return out

    def hash_delete(self, key: str, fields: Sequence[str], *, replicas: int = 0) -> None:
        if fields:
            self._durable(replicas, "HDEL", self._key(key), *fields)

    def _durable(self, replicas: int, *args: Any) -> None:
        """A write, then (``replicas`` > 0) ``WAIT`` on the same pooled connection: ``WAIT`` counts only the
        writes of its own connection. Fewer replicas than asked: :class:`BusUnavailableError`."""
        if replicas <= 0:
            self._call(*args)
            return
        _, acked = self._call_pair(args, ("WAIT", replicas, self.wait_timeout_ms))
        if int(acked) < replicas:
            raise BusUnavailableError(f"redis at {self.url}: {args[0]} on {args[1].decode(errors='replace')} reached "
                                      f"{acked} of {replicas} replica(s) within {self.wait_timeout_ms} ms; "
                                      "not acknowledged")

    def delete(self, *keys: str) -> None:
        if keys:
            self._call("DEL", *(self._key(k) for k in keys))

    def ping(self) -> bool:
        try:
            return bool(self._call("PING"))
        except BusUnavailableError:
            return False

    def close(self) -> None:
        self._pool.disconnect()
        for sock, lock in ((self._reader, self._reader_lock), (self._writer, self._writer_lock)):
            with lock:
                sock.close()


def _command_and_key(args: Sequence[Any]) -> tuple[str, Any]:
    """``("XGROUP CREATE", key)`` from a command's arguments, for messages (keyless commands: no key)."""
    name = str(args[0]).upper()
    if name in ("XGROUP", "XINFO") and len(args) > 2:
        return f"{name} {str(args[1]).upper()}", args[2]
    return name, args[1] if len(args) > 1 and name != "PING" else None
