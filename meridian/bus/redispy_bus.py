"""``StreamBus`` over redis-py alone: one Redis (``redis.Redis``) or a Redis Cluster (``RedisCluster``).

Every command goes through redis-py, with its C reply parser (hiredis) when installed, so whatever redis-py
speaks works here: ACL users, TLS, RESP2/RESP3 and a Redis Cluster's slots and redirections (``MOVED``,
``ASK``, a primary replaced by its replica). :class:`~meridian.bus.redis_bus.RedisStreamBus` keeps a
hand-written RESP path for one Redis beside it; which one a URL gets is :func:`meridian.bus.open_bus`'s
rule, and ``meridian bench telemetry`` measures both in one run.

Design
------
* Stream replies are taken raw on one Redis: the response callbacks that build a dict per entry are replaced
  by the identity for the stream commands this bus sends. A cluster's per-node clients keep redis-py's
  callbacks (they are rebuilt on every topology change), so :func:`_entries` reads both shapes.
* ``publish_many`` pipelines ``XADD`` in chunks (``transaction=False``; on a cluster the pipeline groups
  commands by node, and one stream is one slot). Per-entry errors are collected, never half-raised.
* Durable writes (``hash_set``/``hash_delete`` with ``replicas``): the write and ``WAIT replicas timeout``
  travel on one connection of the key's primary (``WAIT`` counts only its own connection's writes), and
  fewer replicas than asked raise :class:`BusUnavailableError`: the write may be on the primary alone and
  could be lost with it, so the caller must not acknowledge it.
* Failures: redis-py's own retries follow a cluster through a failover (``retry_s`` of back-off, then
  :class:`BusUnavailableError`), and the cluster client refreshes its slot map when a node is gone or
  answers ``MOVED``. On one Redis, retries are off as in the hand-written bus: the caller backs off.
* ``NOGROUP`` on a read (the server lost the group, e.g. a restart without persistence or a failover to
  a replica that had not yet received the group) recreates the group from ``0`` and retries once.

Hazards: Redis replicates asynchronously. An ``XADD`` acknowledged by a primary that dies before its
replica received it is lost in the failover (docs/redis-cluster.md measures how many); only the writes
made with ``replicas`` are confirmed on a replica before they are acknowledged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
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
from meridian.bus.connection import RedisEndpoint, RedisSecuritySettings, endpoint_from_url
from meridian.bus.streams import dead_letter_stream

T = TypeVar("T")

_PAYLOAD_FIELD_BYTES = PAYLOAD_FIELD.encode()
#: Stream commands whose redis-py response callbacks are replaced by the identity (raw replies).
_RAW_COMMANDS = ("XREADGROUP", "XAUTOCLAIM", "XRANGE", "XREVRANGE", "XPENDING", "XINFO GROUPS", "HSCAN")
_UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError, OSError)
#: Entries per pipelined chunk in ``publish_many`` (both buses): large enough to amortise the round trip,
#: small enough that the replies (about 20 bytes each) never fill a socket buffer while the writer still writes.
PIPELINE_CHUNK = 2000


def _raw(response: Any, **_: Any) -> Any:
    return response


def _entries(raw: Any) -> list[StreamEntry]:
    """Stream entries from a raw ``[[id, [field, value, …]], …]`` reply, or the ``[(id, {field: value})]`` a
    cluster node's own response callbacks make (deleted entries skipped)."""
    out: list[StreamEntry] = []
    append = out.append
    for entry_id, fields in raw or ():
        if not fields:
            continue
        if isinstance(fields, dict):
            payload = fields.get(_PAYLOAD_FIELD_BYTES, b"")
        elif fields[0] == _PAYLOAD_FIELD_BYTES:
            payload = fields[1]
        else:
            pairs = dict(zip(fields[::2], fields[1::2], strict=False))
            payload = pairs.get(_PAYLOAD_FIELD_BYTES, b"")
        append(StreamEntry(entry_id.decode() if isinstance(entry_id, bytes) else entry_id, payload))
    return out


def _read_entries(reply: Any) -> list[StreamEntry]:
    """Entries of a one-stream ``XREADGROUP`` reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return _entries(next(iter(reply.values())))
    return _entries(reply[0][1])


class RedisPyStreamBus:
    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, key_prefix: str = "",
                 socket_timeout_s: float = 5.0, connect_timeout_s: float = 1.0, max_connections: int = 16,
                 security: RedisSecuritySettings | None = None, retry_s: float = 10.0,
                 wait_timeout_ms: int = 2000) -> None:
        """``url`` ``redis+cluster://host:port`` reaches a Redis Cluster through that seed node. ``retry_s``: how
        long a cluster client keeps retrying through a failover before :class:`BusUnavailableError`.
        ``wait_timeout_ms``: how long a durable write waits for its replicas."""
        self._endpoint: RedisEndpoint = endpoint_from_url(
            url, security if security is not None else RedisSecuritySettings())
        if self._endpoint.tls:
            self._endpoint.ssl_context()  # an unreadable CA or client certificate fails here, at start
        self.url = self._endpoint.redacted_url
        self.user = self._endpoint.user
        self.key_prefix = key_prefix
        self.socket_timeout_s = socket_timeout_s
        self.wait_timeout_ms = wait_timeout_ms
        common = dict(self._endpoint.redis_kwargs(), socket_timeout=socket_timeout_s,
                      socket_connect_timeout=connect_timeout_s, max_connections=max_connections,
                      decode_responses=False)
        self._client: redis.Redis | RedisCluster
        if self._endpoint.cluster:
            # Back-off doubling from 50 ms to 1 s: about retry_s in all, enough for a replica to take over
            # (cluster-node-timeout plus an election) without a caller seeing the outage.
            attempts = max(1, int(retry_s / 0.75))
            self._client = RedisCluster(**common, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), attempts))
        else:
            self._client = redis.Redis(**common, retry=Retry(NoBackoff(), 0))
        for command in _RAW_COMMANDS:
            self._client.set_response_callback(command, _raw)

    @property
    def is_cluster(self) -> bool:
        return isinstance(self._client, RedisCluster)

    # ------------------------------------------------------------------ plumbing
    def _key(self, name: str) -> str:
        return self.key_prefix + name

    def _auth_failed(self, reason: object) -> BusAuthenticationError:
        given = "" if self._endpoint.password else "no password is given; "
        return BusAuthenticationError(f"redis at {self.url} refused user {self.user!r}: {given}{reason} (credentials: "
                                      "the URL, MERIDIAN_REDIS_USERNAME, MERIDIAN_REDIS_PASSWORD_FILE)")

    def _run(self, command: str, key: str | None, fn: Callable[[], T]) -> T:
        """Run ``fn`` and translate redis-py's exceptions into the bus's."""
        try:
            return fn()
        except redis.exceptions.NoPermissionError as exc:
            target = f" on {key}" if key else ""
            raise BusPermissionError(f"redis user {self.user!r} may not {command}{target} at {self.url}: NOPERM {exc} "
                                     "(ACL users and what each may reach: deploy/redis/users.acl)") from None
        except redis.exceptions.AuthenticationError as exc:
            raise self._auth_failed(exc) from None
        except _UNAVAILABLE as exc:
            raise BusUnavailableError(f"redis at {self.url}: {command}: {exc}") from exc
        except redis.exceptions.ResponseError as exc:
            raise BusError(f"{command}{f' on {key}' if key else ''}: {exc}") from exc

    def _execute(self, *args: Any) -> Any:
        key = args[1] if len(args) > 1 else None
        return self._run(str(args[0]), key if isinstance(key, str) else None,
                         lambda: self._client.execute_command(*args))

    # ------------------------------------------------------------------ StreamBus
    def publish(self, stream: str, payload: bytes, *, maxlen: int | None = None) -> str:
        trim = ("MAXLEN", "~", maxlen) if maxlen is not None else ()
        reply = self._execute("XADD", self._key(stream), *trim, "*", PAYLOAD_FIELD, payload)
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def publish_many(self, stream: str, payloads: Sequence[bytes], *, maxlen: int | None = None) -> int:
        if not payloads:
            return 0
        key = self._key(stream)
        trim = ("MAXLEN", "~", maxlen) if maxlen is not None else ()
        errors: list[Exception] = []
        for start in range(0, len(payloads), PIPELINE_CHUNK):
            pipe = self._client.pipeline(transaction=False)
            for payload in payloads[start:start + PIPELINE_CHUNK]:
                pipe.execute_command("XADD", key, *trim, "*", PAYLOAD_FIELD, payload)
            replies = self._run("XADD", key, lambda p=pipe: p.execute(raise_on_error=False))  # type: ignore[misc]
            errors.extend(r for r in replies if isinstance(r, Exception))
        if errors:
            first = errors[0]
            if isinstance(first, redis.exceptions.NoPermissionError):
                raise BusPermissionError(f"redis user {self.user!r} may not XADD on {key} at {self.url}: {first}")
            if isinstance(first, _UNAVAILABLE):
                raise BusUnavailableError(f"redis at {self.url}: {len(errors)} of {len(payloads)} XADD on {stream} "
                                          f"failed: {first}")
            raise BusError(f"{len(errors)} of {len(payloads)} XADD failed on {stream}: {first}")
        return len(payloads)

    def ensure_group(self, stream: str, group: str, *, start_id: str = "0") -> None:
        try:
            self._execute("XGROUP", "CREATE", self._key(stream), group, start_id, "MKSTREAM")
        except BusError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read_group(self, stream: str, group: str, consumer: str, *, count: int,
                   block_ms: int | None = None) -> list[StreamEntry]:
        key = self._key(stream)
        block: tuple[Any, ...] = ()
        if block_ms:
            block = ("BLOCK", min(int(block_ms), int(self.socket_timeout_s * 1000) - 500))
        for attempt in range(2):
            try:
                reply = self._execute("XREADGROUP", "GROUP", group, consumer, "COUNT", int(count), *block,
                                      "STREAMS", key, ">")
                return _read_entries(reply)
            except BusError as exc:
                if isinstance(exc, BusUnavailableError) or "NOGROUP" not in str(exc) or attempt:
                    raise
                self.ensure_group(stream, group, start_id="0")
        return []

    def ack(self, stream: str, group: str, entry_ids: Sequence[str]) -> int:
        if not entry_ids:
            return 0
        return int(self._execute("XACK", self._key(stream), group, *entry_ids))

    def claim_stale(self, stream: str, group: str, consumer: str, *, min_idle_ms: int,
                    count: int) -> list[StreamEntry]:
        claimed: list[StreamEntry] = []
        cursor: Any = "0-0"
        while len(claimed) < count:
            try:
                reply = self._execute("XAUTOCLAIM", self._key(stream), group, consumer, int(min_idle_ms), cursor,
                                      "COUNT", count - len(claimed))
            except BusError as exc:
                if not isinstance(exc, BusUnavailableError) and "NOGROUP" in str(exc):
                    return claimed
                raise
            cursor, entries = reply[0], reply[1]
            claimed.extend(_entries(entries))
            if cursor in (b"0-0", "0-0"):
                break
        return claimed

    def pending(self, stream: str, group: str) -> int:
        try:
            reply = self._execute("XPENDING", self._key(stream), group)
        except BusError as exc:
            if not isinstance(exc, BusUnavailableError) and "NOGROUP" in str(exc):
                return 0
            raise
        return int(reply["pending"] if isinstance(reply, dict) else reply[0])

    def group_lag(self, stream: str, group: str) -> int | None:
        try:
            reply = self._execute("XINFO", "GROUPS", self._key(stream))
        except BusError as exc:
            if not isinstance(exc, BusUnavailableError) and "no such key" in str(exc).lower():
                return 0
            raise
        for flat in reply or ():
            info = flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=False))
            info = {k.decode() if isinstance(k, bytes) else k: v for k, v in info.items()}
            name = info.get("name")
            if (name.decode() if isinstance(name, bytes) else name) == group:
                lag = info.get("lag")
                return None if lag is None else int(lag)
        return 0

    def length(self, stream: str) -> int:
        return int(self._execute("XLEN", self._key(stream)))

    def read_range(self, stream: str, *, count: int | None = None) -> list[StreamEntry]:
        extra = ("COUNT", count) if count is not None else ()
        return _entries(self._execute("XRANGE", self._key(stream), "-", "+", *extra))

    def read_latest(self, stream: str) -> StreamEntry | None:
        entries = _entries(self._execute("XREVRANGE", self._key(stream), "+", "-", "COUNT", 1))
        return entries[0] if entries else None

    def dead_letter(self, stream: str, entry: StreamEntry, *, reason: str, group: str = "",
                    consumer: str = "", payload_kept_bytes: int = DEAD_LETTER_PAYLOAD_KEPT_BYTES,
                    maxlen: int | None = 10_000) -> str:
        envelope = dead_letter_payload(stream, entry, reason=reason, group=group, consumer=consumer,
                                       payload_kept_bytes=payload_kept_bytes)
        trim = ("MAXLEN", "~", maxlen) if maxlen is not None else ()
        reply = self._execute("XADD", self._key(dead_letter_stream(stream)), *trim, "*", PAYLOAD_FIELD, envelope,
                              "reason", reason)
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def set_value(self, key: str, value: bytes) -> None:
        self._execute("SET", self._key(key), value)

    def get_value(self, key: str) -> bytes | None:
        return self._execute("GET", self._key(key))  # type: ignore[no-any-return]

    def hash_set(self, key: str, items: Mapping[str, bytes], *, replicas: int = 0) -> None:
        if items:
            self._durable("HSET", key, [x for kv in items.items() for x in kv], replicas)

    def hash_items(self, key: str) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        cursor: Any = 0
        while True:  # HSCAN, not HGETALL: a large hash must not block Redis in one reply
            cursor, flat = self._execute("HSCAN", self._key(key), cursor, "COUNT", 1000)
            pairs = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
            out.extend((f.decode(), v) for f, v in pairs)
            if cursor in (b"0", 0, "0"):
                return out

    def hash_delete(self, key: str, fields: Sequence[str], *, replicas: int = 0) -> None:
        if fields:
            self._durable("HDEL", key, list(fields), replicas)

    def _durable(self, command: str, key: str, args: list[Any], replicas: int) -> None:
        """``command key *args``, then (``replicas`` > 0) ``WAIT replicas`` on the same connection."""
        full = self._key(key)
        if replicas <= 0:
            self._execute(command, full, *args)
            return
        if isinstance(self._client, RedisCluster):
            cluster = self._client

            def node_client() -> redis.Redis:
                node = cluster.get_node_from_key(full)
                return cluster.get_redis_connection(node)
        else:
            single = self._client

            def node_client() -> redis.Redis:
                return single

        def write() -> Any:
            pipe = node_client().pipeline(transaction=False)
            pipe.execute_command(command, full, *args)
            pipe.execute_command("WAIT", replicas, self.wait_timeout_ms)
            return pipe.execute(raise_on_error=False)

        try:
            result, acked = self._run(command, full, write)
        except BusUnavailableError:
            self._refresh_topology()
            raise
        if isinstance(result, _UNAVAILABLE) or (isinstance(result, redis.exceptions.ResponseError) and str(result)
                                                .startswith(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "LOADING"))):
            self._refresh_topology()
            raise BusUnavailableError(f"redis at {self.url}: {command} on {full}: {result} (failing over); retry")
        if isinstance(result, Exception):
            raise BusError(f"{command} on {full}: {result}")
        if isinstance(acked, Exception) or int(acked) < replicas:
            raise BusUnavailableError(f"redis at {self.url}: {command} on {full} reached {acked} of {replicas} "
                                      f"replica(s) within {self.wait_timeout_ms} ms; not acknowledged")

    def _refresh_topology(self) -> None:
        """After a node failed or a slot moved, reload the cluster's slot map (the next call uses it)."""
        if isinstance(self._client, RedisCluster):
            with contextlib.suppress(Exception):  # still failing over: the next call tries again
                self._client.nodes_manager.initialize()

    def delete(self, *keys: str) -> None:
        if keys:
            self._run("DEL", None, lambda: self._client.delete(*(self._key(k) for k in keys)))

    def ping(self) -> bool:
        try:
            return bool(self._run("PING", None, self._client.ping))
        except BusError:
            return False

    def close(self) -> None:
        self._client.close()
