"""High availability of the global scheduler: leader election on a Redis lock with fencing tokens.

Two (or more) replicas run; each serves the gRPC API, only the leader routes and dispatches (the
router, events, summaries, sweeper and reconciler workers and the routing worker process). The
followers forward every API call to the leader (:mod:`global_scheduler.leader_forwarding`).

Why a Redis lock and not a Kubernetes Lease: everything the global tier must keep consistent (the
workload store ``meridian:workloads``, the dispatch and event streams) already lives in that Redis,
so the lock, its fencing token and the guarded writes are one system with one failure domain: the
check "am I still the leader" and the write it guards run in one Lua script, atomically. A Lease in
the hub cluster would fence nothing in Redis (a deposed leader could still write there) and add a
second dependency whose outage would stop a tier that does not otherwise need the hub's API server.

The lock (:class:`RedisLease`)
------------------------------
* ``meridian:global:leader`` holds ``"<epoch> <instance> <advertise>"``, set with ``PX`` = the lease
  duration and only if absent; the epoch comes from ``INCR meridian:global:leader:epoch`` in the same
  script, so every term has a fresh, larger token (the whole value is the fencing token).
* Renewal is a compare-and-set script: ``PEXPIRE`` only if the value is still ours.
* A graceful stop deletes the lock if still ours (compare-and-delete), so the other replica takes over
  within one retry period instead of a lease duration.
* Fencing (:class:`Fence`): the store's writes (a new workload, a flush of changed records — and a new
  attempt is made durable by a flush *before* it is published) go through a script that runs the
  ``HSET`` only if the lock still holds our token; otherwise nothing is written and :class:`FencedError`
  (a ``BusError``) is raised. The router then rolls the attempt back and publishes nothing, so a
  deposed leader never publishes a dispatch of a new attempt. A republish of an attempt already durable
  (reconciliation) or a release is harmless: the regional worker applies a ``(workload, attempt)`` once.
  Before it asks Redis, the fence also refuses locally once the term's renew deadline has passed.

Timing (:class:`LeaderElector`), as client-go's leaderelection
---------------------------------------------------------------
* ``lease_duration_s`` (L): the lock's TTL in Redis. ``renew_deadline_s`` (D < L): a leader that has not
  renewed for D (measured from the moment it *sent* the last successful renewal, which is no later than
  the moment Redis extended the TTL) stops routing — before its lease can have expired anywhere, as long
  as clocks run at about the same rate. ``retry_period_s`` (R): how often the leader renews and a
  follower tries to acquire.
* A renewal answered "not ours" (another replica holds the lock) ends the term at once.
* Failover after a leader dies: at most L (its lock expires) + R (the follower's next try) + the time
  to restore the store from Redis (``GlobalScheduler.resume``) before the new leader routes.

Hazards: the lock key and a workload bucket are touched by one script, so on a Redis Cluster they would
have to share a slot, and the buckets have their own hash tags; HA targets one Redis or a Sentinel pair, and
the global scheduler refuses HA on a ``redis+cluster://`` bus. A Redis failover that loses the lock's last write (asynchronous replication) can give two leaders a
term each; the fencing check is then only as good as that replica's copy of the lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meridian.bus import BusError, BusUnavailableError

log = logging.getLogger(__name__)

LOCK_KEY = "meridian:global:leader"
EPOCH_KEY = "meridian:global:leader:epoch"

# KEYS[1] lock, KEYS[2] epoch; ARGV[1] "<instance> <advertise>", ARGV[2] lease ms.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local epoch = redis.call('INCR', KEYS[2])
local value = epoch .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
"""
# KEYS[1] lock; ARGV[1] token, ARGV[2] lease ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS[1] lock, KEYS[2] hash; ARGV[1] token, then field, value, …
_FENCED_HSET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED not the leader') end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return #ARGV - 1
"""
_FENCED_HDEL = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED not the leader') end
for i = 2, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
return #ARGV - 1
"""


class FencedError(BusError):
    """A store write refused because this replica no longer holds the leader lock (nothing was written)."""


@dataclass(frozen=True)
class LeaderRecord:
    """What the lock says: the term's epoch, the holder's instance name and its API address."""

    epoch: int
    instance: str
    advertise: str
    token: str

    @classmethod
    def parse(cls, raw: bytes | str | None) -> LeaderRecord | None:
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        parts = text.split(" ", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            return None
        return cls(int(parts[0]), parts[1], parts[2], text)


class RedisLease:
    """The lock's operations on one Redis (redis-py client, keys under ``key_prefix``). Connection
    failures raise :class:`BusUnavailableError`."""

    def __init__(self, client: Any, *, key_prefix: str = "", lock_key: str = LOCK_KEY,
                 wait_timeout_ms: int = 2000) -> None:
        self.client = client
        self.wait_timeout_ms = wait_timeout_ms
        self.key_prefix = key_prefix
        self.lock_key = key_prefix + lock_key
        self.epoch_key = key_prefix + lock_key + ":epoch"
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._hset = client.register_script(_FENCED_HSET)
        self._hdel = client.register_script(_FENCED_HDEL)

    def _run(self, fn: Callable[[], Any]) -> Any:
        import redis

        try:
            return fn()
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith("FENCED"):
                raise FencedError(f"store write refused: {exc}") from None
            raise BusError(str(exc)) from exc
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise BusUnavailableError(f"leader lock: redis unreachable: {exc}") from exc

    def try_acquire(self, instance: str, advertise: str, lease_ms: int) -> LeaderRecord | None:
        raw = self._run(lambda: self._acquire(keys=[self.lock_key, self.epoch_key],
                                              args=[f"{instance} {advertise}", lease_ms]))
        return LeaderRecord.parse(raw) if raw else None

    def renew(self, token: str, lease_ms: int) -> bool:
        return bool(self._run(lambda: self._renew(keys=[self.lock_key], args=[token, lease_ms])))

    def release(self, token: str) -> bool:
        return bool(self._run(lambda: self._release(keys=[self.lock_key], args=[token])))

    def current(self) -> LeaderRecord | None:
        return LeaderRecord.parse(self._run(lambda: self.client.get(self.lock_key)))

    def fenced_hash_set(self, token: str, key: str, items: Mapping[str, bytes], *, replicas: int = 0) -> None:
        if items:
            args: list[Any] = [token]
            for k, v in items.items():
                args += [k, v]
            self._fenced(self._hset, key, args, replicas)

    def fenced_hash_delete(self, token: str, key: str, fields: Sequence[str], *, replicas: int = 0) -> None:
        if fields:
            self._fenced(self._hdel, key, [token, *fields], replicas)

    def _fenced(self, script: Any, key: str, args: list[Any], replicas: int) -> None:
        """The fenced script, then (``replicas`` > 0) ``WAIT`` on the same connection, as the bus's durable writes."""
        keys = [self.lock_key, self.key_prefix + key]
        if replicas <= 0:
            self._run(lambda: script(keys=keys, args=args))
            return

        def write() -> Any:
            pipe = self.client.pipeline(transaction=False)
            script(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", replicas, self.wait_timeout_ms)
            return pipe.execute()

        _, acked = self._run(write)
        if int(acked) < replicas:
            raise BusUnavailableError(f"store write to {key} reached {acked} of {replicas} replica(s) within "
                                      f"{self.wait_timeout_ms} ms; not acknowledged")


class LeaderElector:
    """Acquires and renews the lock on a thread; calls ``on_started(record)`` when this replica becomes the
    leader and ``on_stopped()`` when it stops (renewal refused, or not renewed within the renew deadline).

    :meth:`step` is one round (what the thread does every ``retry_period_s``); tests call it directly with
    an injected ``clock`` (monotonic seconds)."""

    def __init__(self, lease: RedisLease, *, instance: str, advertise: str, lease_duration_s: float = 5.0,
                 renew_deadline_s: float = 3.5, retry_period_s: float = 0.5,
                 on_started: Callable[[LeaderRecord], None] = lambda record: None,
                 on_stopped: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(f"need 0 < retry_period_s ({retry_period_s:g}) < renew_deadline_s ({renew_deadline_s:g}) "
                             f"< lease_duration_s ({lease_duration_s:g})")
        self.lease = lease
        self.instance = instance
        self.advertise = advertise
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self._lock = threading.Lock()
        self.record: LeaderRecord | None = None  # ours, while we lead
        self.leader: LeaderRecord | None = None  # whoever the lock named at the last look
        self._renewed_at = 0.0  # clock() when the last successful renewal (or the acquisition) was sent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.terms = 0
        self.changed = threading.Condition()

    @property
    def lease_ms(self) -> int:
        return int(self.lease_duration_s * 1000)

    def is_leader(self) -> bool:
        """Leading, and the renew deadline of the term has not passed (checked without the thread's help)."""
        with self._lock:
            return self.record is not None and self.clock() < self._renewed_at + self.renew_deadline_s

    def token(self) -> str | None:
        """The fencing token while :meth:`is_leader` holds."""
        with self._lock:
            if self.record is not None and self.clock() < self._renewed_at + self.renew_deadline_s:
                return self.record.token
            return None

    def step(self) -> None:
        sent = self.clock()
        with self._lock:
            record = self.record
        if record is None:
            try:
                got = self.lease.try_acquire(self.instance, self.advertise, self.lease_ms)
                if got is None:
                    self._set_leader(self.lease.current())
                    return
            except (BusUnavailableError, BusError) as exc:
                log.debug("leader election: %s", exc)
                return
            with self._lock:
                self.record, self._renewed_at = got, sent
                self.terms += 1
            self._set_leader(got)
            log.info("became the leader (epoch %d, %s)", got.epoch, self.advertise)
            self.on_started(got)
            return
        try:
            renewed = self.lease.renew(record.token, self.lease_ms)
        except (BusUnavailableError, BusError) as exc:
            renewed = None
            log.warning("leader lease not renewed (%s); stepping down %.1f s after the last renewal", exc,
                        self.renew_deadline_s)
        if renewed:
            with self._lock:
                if self.record is record:
                    self._renewed_at = sent
            return
        if renewed is False or self.clock() >= self._renewed_at + self.renew_deadline_s:
            self._lose("the lock is held by another replica" if renewed is False else
                       f"not renewed for {self.renew_deadline_s:g} s (renew deadline)")

    def _set_leader(self, record: LeaderRecord | None) -> None:
        with self.changed:
            self.leader = record
            self.changed.notify_all()

    def _lose(self, why: str) -> None:
        with self._lock:
            record, self.record = self.record, None
        if record is None:
            return
        log.warning("lost the leadership (epoch %d): %s; routing stops now", record.epoch, why)
        self._set_leader(None)
        self.on_stopped()

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="leader-elector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = self.clock()
            try:
                self.step()
            except Exception:
                log.exception("leader election round failed")
            # Poll at the retry period; a leader near its deadline still retries at that pace.
            self._stop.wait(max(0.0, self.retry_period_s - (self.clock() - t0)))

    def stop(self, *, release: bool = True) -> None:
        """Stop the thread; if leading, stop the term and (``release``) hand the lock over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            record = self.record
        if record is not None:
            self._lose("shutting down")
            if release:
                try:
                    self.lease.release(record.token)
                except (BusUnavailableError, BusError) as exc:
                    log.warning("leader lock not released (%s); the other replica takes over when it expires", exc)


class Fence:
    """The store's writer in HA mode: every write carries the current term's token and is refused unless the
    lock still holds it (module docstring)."""

    def __init__(self, lease: RedisLease, token: Callable[[], str | None]) -> None:
        self.lease = lease
        self._token = token
        self.refused = 0

    def _current(self) -> str:
        token = self._token()
        if token is None:
            raise FencedError("store write refused: this replica is not the leader")
        return token

    def hash_set(self, key: str, items: Mapping[str, bytes], *, replicas: int = 0) -> None:
        try:
            self.lease.fenced_hash_set(self._current(), key, items, replicas=replicas)
        except FencedError:
            self.refused += 1
            raise

    def hash_delete(self, key: str, fields: Sequence[str], *, replicas: int = 0) -> None:
        try:
            self.lease.fenced_hash_delete(self._current(), key, fields, replicas=replicas)
        except FencedError:
            self.refused += 1
            raise


def new_instance_name() -> str:
    return f"global-{uuid.uuid4().hex[:8]}"


class Replica:
    """One replica's engines across terms. A standby engine (built, not started) waits while this replica
    follows; when it becomes the leader a term thread runs ``engine.start()`` (which restores the store
    from Redis, ``GlobalScheduler.resume``) and only then serves the API locally; when it stops leading,
    the API forwards again at once, the engine is stopped and a fresh standby is built (the old engine's
    memory is a past term's view and is never reused). The standby is hot: its routing worker process is
    started while it waits (``_warm``).

    ``make_engine(fence)`` builds a ``GlobalScheduler`` whose store writes through ``fence``."""

    def __init__(self, *, lease: RedisLease, make_engine: Callable[[Fence], Any], instance: str,
                 advertise: str | None, lease_duration_s: float = 5.0, renew_deadline_s: float = 3.5,
                 retry_period_s: float = 0.5, forward_timeout_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lease = lease
        self.instance = instance
        self.advertise = advertise
        self.forward_timeout_s = forward_timeout_s
        self._make_engine = make_engine
        self.elector = LeaderElector(lease, instance=instance, advertise=advertise or "", clock=clock,
                                     lease_duration_s=lease_duration_s, renew_deadline_s=renew_deadline_s,
                                     retry_period_s=retry_period_s, on_started=self._on_started,
                                     on_stopped=self._on_stopped)
        self.fence = Fence(lease, self.elector.token)
        self.engine = make_engine(self.fence)
        self._ready = threading.Event()  # this term's engine has restored the store and started
        self._events: list[tuple[str, LeaderRecord | None]] = []
        self._events_cv = threading.Condition()
        self._closing = False
        self._worker: threading.Thread | None = None
        self._engine_used = False
        self.forward_credentials: Any = None  # grpc.ChannelCredentials when the API serves TLS
        self.forward_server_name: str | None = None  # the name the leader's certificate is checked against
        self.became_leader_at: float | None = None  # time.time() when the last term started serving
        self.restore_s: float | None = None  # how long the last term's engine.start() took

    @classmethod
    def from_settings(cls, settings: Any, *, make_engine: Callable[[Fence], Any],
                      instance: str | None = None) -> Replica:
        """A replica on the bus's Redis (``settings.bus``) with ``settings.ha``'s timings."""
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from meridian.bus import redis_client

        ha = settings.ha
        url = settings.bus.url
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"ha.enabled needs a Redis bus (bus.url is {url!r}): the lock and the store live there")
        if not settings.store.persist:
            raise ValueError("ha.enabled needs store.persist: a new leader restores the workloads from Redis")
        host = settings.api.listen.rpartition(":")[0].strip("[]")
        if not ha.advertise and host in ("", "0.0.0.0", "::"):
            raise ValueError(f"ha.enabled: the API listens on {settings.api.listen}, which the other replicas cannot "
                             "dial; set ha.advertise (MERIDIAN_GLOBAL_HA__ADVERTISE, e.g. $(POD_IP):50051)")
        # One attempt per command, answered well within a retry period (a renewal must not outlast the deadline).
        timeout = min(1.0, ha.retry_period_s)
        client = redis_client(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                              retry=Retry(NoBackoff(), 0))
        lease = RedisLease(client, key_prefix=settings.bus.key_prefix, lock_key=ha.lock_key)
        return cls(lease=lease, make_engine=make_engine, instance=instance or new_instance_name(),
                   advertise=ha.advertise, lease_duration_s=ha.lease_duration_s,
                   renew_deadline_s=ha.renew_deadline_s, retry_period_s=ha.retry_period_s,
                   forward_timeout_s=ha.forward_timeout_s)

    # ------------------------------------------------------------------ state the API reads
    def leading(self) -> bool:
        """Serve the API locally: the term's engine is running and the lease is within its renew deadline."""
        return self._ready.is_set() and self.elector.is_leader()

    def leader(self) -> LeaderRecord | None:
        return self.elector.leader

    def wait_leader_change(self, timeout_s: float) -> None:
        with self.elector.changed:
            self.elector.changed.wait(timeout=timeout_s)

    # ------------------------------------------------------------------ terms
    def start(self, advertise: str | None = None) -> None:
        if advertise and not self.advertise:
            self.advertise = self.elector.advertise = advertise
        if not self.advertise:
            raise ValueError("ha: no address to advertise (ha.advertise)")
        self._worker = threading.Thread(target=self._run_terms, name="leader-terms", daemon=True)
        with self._events_cv:
            self._events.append(("warm", None))
        self._worker.start()
        self.elector.start()

    def _on_started(self, record: LeaderRecord) -> None:
        with self._events_cv:
            self._events.append(("start", record))
            self._events_cv.notify_all()

    def _on_stopped(self) -> None:
        self._ready.clear()  # the API forwards from now on
        with self._events_cv:
            self._events.append(("stop", None))
            self._events_cv.notify_all()

    def _run_terms(self) -> None:
        while True:
            with self._events_cv:
                while not self._events and not self._closing:
                    self._events_cv.wait()
                if not self._events:
                    return
                kind, record = self._events.pop(0)
            try:
                if kind == "start":
                    self._start_term(record)
                elif kind == "warm":
                    self._warm()
                else:
                    self._stop_term()
            except Exception:
                log.exception("leadership %s failed", kind)

    def _warm(self) -> None:
        """A hot standby: the standby engine's routing worker process is started (its policy built) while this
        replica follows, so a failover does not wait seconds for it (``engine.start`` then only pings it)."""
        worker = getattr(self.engine, "worker", None)
        if worker is None or self._engine_used:
            return
        t0 = time.monotonic()
        try:
            worker.start()
            log.info("standby: routing worker process ready in %.1f s", time.monotonic() - t0)
        except Exception as exc:  # engine.start tries again, and routes in-process meanwhile
            log.warning("standby: routing worker did not start (%s: %s)", type(exc).__name__, exc)

    def _start_term(self, record: LeaderRecord | None) -> None:
        if self.elector.record is not record or not self.elector.is_leader():
            return  # lost again before it began
        t0 = time.monotonic()
        self._engine_used = True
        self.engine.start()  # restores the store from Redis (resume) before any worker routes
        self.restore_s = time.monotonic() - t0
        if self.elector.record is record and self.elector.is_leader():
            self.became_leader_at = time.time()
            self._ready.set()
            log.info("leading: store restored (%d workloads) and routing %.2f s after winning the election",
                     len(self.engine.store), self.restore_s)

    def _stop_term(self) -> None:
        old = self.engine
        if self._closing:  # shutting down: no standby for a next term
            old.stop()
            return
        if self._engine_used:  # started in a term: never reused
            self._engine_used = False
            old.stop()
            bus = getattr(old, "bus", None)
            self.engine = self._make_engine(self.fence)
            self._warm()
            if bus is not None and bus is not self.engine.bus:
                with contextlib.suppress(Exception):  # closing a dead connection
                    bus.close()

    def close(self) -> None:
        """Stop routing, then hand the lock over (compare-and-delete) so the other replica takes over now."""
        record = self.elector.record
        with self._events_cv:
            self._closing = True
        self.elector.stop(release=False)  # stops the term (queues "stop") if leading
        with self._events_cv:
            self._events_cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=15)
        self.engine.stop()
        if record is not None:
            try:
                self.lease.release(record.token)
            except (BusUnavailableError, BusError) as exc:
                log.warning("leader lock not released (%s); the other replica takes over when it expires", exc)
