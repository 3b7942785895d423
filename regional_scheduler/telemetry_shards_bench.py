"""Issue 27's two telemetry measurements, for ``meridian bench telemetry``:

* :func:`measure_clients`: the production bus (:class:`~meridian.bus.RedisStreamBus`: redis-py plus the
  hand-packed publish) beside the pure redis-py (+ hiredis) bus (:class:`~meridian.bus.redispy_bus.RedisPyStreamBus`)
  on the same single Redis and the same payloads, in alternating passes so that machine noise hits both:
  pipelined publish (``publish_many`` chunks) and a bare XREADGROUP + XACK drain of a pre-filled stream.
  Both buses read through redis-py (the hand-written reader measured 0.99–1.01× redis-py and was removed),
  so the drain ratio is a control: it should stay near 1;
* :func:`measure_shards`: producer *processes* publishing flat out to ``streams`` member clusters' telemetry
  streams on a real :class:`~meridian.local_redis_cluster.LocalRedisCluster` of 1, 2, 3 … primaries,
  through the production bus or the pure redis-py one; acknowledged reports/s over the
  window and the CPU (% of one core) each redis-server and each producer used in it; optionally repeated
  with the redis-servers pinned to one core and the producers to another.

Heavy imports (redis, psutil, the buses) happen inside the functions: this module is imported by the CLI.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Redis Cluster hash slots.
SLOTS = 16384
CLIENT_BUSES = ("hand_written", "redis_py")


# ---------------------------------------------------------------------------------------------- clients
def _open_client(kind: str, url: str, key_prefix: str) -> Any:
    from meridian.bus import RedisStreamBus
    from meridian.bus.redispy_bus import RedisPyStreamBus

    return (RedisStreamBus if kind == "hand_written" else RedisPyStreamBus)(url, key_prefix=key_prefix)


def _publish_pass(bus: Any, stream: str, payloads: Sequence[bytes], seconds: float, chunk: int) -> tuple[int, float]:
    """Pipelined publish of ``payloads`` in ``chunk``-sized ``publish_many`` calls for ``seconds`` (whole chunks)."""
    bus.delete(stream)
    sent, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for s in range(0, len(payloads), chunk):
            sent += bus.publish_many(stream, payloads[s:s + chunk], maxlen=200_000)
            if time.perf_counter() - started >= seconds:
                break
    elapsed = time.perf_counter() - started
    bus.delete(stream)
    return sent, elapsed


def _drain_pass(bus: Any, filler: Any, stream: str, payloads: Sequence[bytes], reports: int, batch: int,
                chunk: int) -> tuple[int, float]:
    """``filler`` publishes ``reports`` entries (untimed); then ``bus`` reads them with XREADGROUP ``batch`` at
    a time and acknowledges each batch until the group has nothing new (timed)."""
    filler.delete(stream)
    filler.ensure_group(stream, "drain", start_id="0")
    published = 0
    while published < reports:
        for s in range(0, len(payloads), chunk):
            n = min(chunk, reports - published)
            if n <= 0:
                break
            published += filler.publish_many(stream, payloads[s:s + n], maxlen=None)
    drained, started = 0, time.perf_counter()
    while entries := bus.read_group(stream, "drain", "drain-0", count=batch, block_ms=None):
        bus.ack(stream, "drain", [e.entry_id for e in entries])
        drained += len(entries)
    elapsed = time.perf_counter() - started
    filler.delete(stream)
    return drained, elapsed


def measure_clients(url: str, payloads: Sequence[bytes], *, key_prefix: str, seconds: float = 2.0, rounds: int = 4,
                    drain_reports: int = 50_000, batch: int = 5000, chunk: int = 2000) -> dict[str, Any]:
    """Hand-written vs redis-py bus on the single Redis at ``url``: ``rounds`` alternating passes of each,
    publish (``seconds`` per bus in all) then drain (``drain_reports`` per pass; 0 skips the drain).
    Rates are reports over the seconds the passes took, summed over the passes; ``ratio`` = hand-written /
    redis-py. Every stream used is deleted."""
    import redis.utils

    if not payloads:
        raise ValueError("measure_clients needs at least one payload")
    rounds = max(1, rounds)
    buses = {kind: _open_client(kind, url, key_prefix) for kind in CLIENT_BUSES}
    streams = {kind: f"bench:clients:{kind}" for kind in CLIENT_BUSES}
    totals: dict[str, dict[str, list[float]]] = {path: {k: [0.0, 0.0] for k in CLIENT_BUSES}
                                                 for path in ("publish", "drain")}
    passes: dict[str, list[dict[str, float]]] = {"publish": [], "drain": []}
    try:
        for kind, bus in buses.items():  # warm-up: connect, first replies
            bus.publish_many(streams[kind], payloads[:chunk], maxlen=None)
            bus.delete(streams[kind])
        for path in ("publish", "drain"):
            if path == "drain" and drain_reports <= 0:
                continue
            for _ in range(rounds):
                one: dict[str, float] = {}
                for kind, bus in buses.items():
                    if path == "publish":
                        n, dt = _publish_pass(bus, streams[kind], payloads, seconds / rounds, chunk)
                    else:
                        n, dt = _drain_pass(bus, buses["hand_written"], streams[kind], payloads, drain_reports,
                                            batch, chunk)
                    totals[path][kind][0] += n
                    totals[path][kind][1] += dt
                    one[kind] = round(n / dt, 1) if dt > 0 else 0.0
                passes[path].append(one)
    finally:
        for kind, bus in buses.items():
            try:
                bus.delete(streams[kind])
            finally:
                bus.close()
    out: dict[str, Any] = {"hiredis": bool(redis.utils.HIREDIS_AVAILABLE), "redis_py": redis.__version__,
                           "rounds": rounds, "payloads": len(payloads), "chunk": chunk, "batch": batch,
                           "drain_reports_per_pass": drain_reports}
    for path in ("publish", "drain"):
        if not passes[path]:
            out[path] = None
            continue
        rates = {k: n / dt if dt > 0 else 0.0 for k, (n, dt) in totals[path].items()}
        out[path] = {"hand_written": round(rates["hand_written"], 1), "redis_py": round(rates["redis_py"], 1),
                     "ratio": round(rates["hand_written"] / rates["redis_py"], 3) if rates["redis_py"] else None,
                     "passes": passes[path]}
    return out


# ----------------------------------------------------------------------------------------------- shards
def balanced_members(count: int, primaries: Sequence[int], *, prefix: str = "bench-") -> list[str]:
    """``count`` member-cluster names ``<prefix><k>`` whose telemetry streams' slots spread as evenly as they can
    over the slot ranges of every cluster size in ``primaries`` (the even split ``LocalRedisCluster`` and
    ``redis-cli --cluster create`` give): the first names ``bench-0 …`` hash unevenly (3 primaries: 2, 3
    and 7 of 12), which would measure the hottest primary, not the cluster. Each cell of the common
    refinement of those ranges gets streams in proportion to its width (largest remainder)."""
    from redis.cluster import key_slot

    from meridian.bus import telemetry_stream

    sizes = sorted({n for n in primaries if n >= 1}) or [1]
    cuts = sorted({round(i * SLOTS / n) for n in sizes for i in range(n + 1)})
    widths = [b - a for a, b in itertools.pairwise(cuts)]
    quota = [count * w // SLOTS for w in widths]
    by_remainder = sorted(range(len(widths)), key=lambda c: -(count * widths[c] % SLOTS))
    for c in by_remainder[:count - sum(quota)]:
        quota[c] += 1
    chosen: list[tuple[int, str]] = []
    k = 0
    while len(chosen) < count and k < 1_000_000:
        name = f"{prefix}{k}"
        slot = key_slot(telemetry_stream(name).encode())
        cell = next(c for c in range(len(widths)) if slot < cuts[c + 1])
        if quota[cell] > 0:
            quota[cell] -= 1
            chosen.append((k, name))
        k += 1
    return [name for _, name in sorted(chosen)]


def _shard_producer(index: int, url: str, streams: list[str], payloads: list[bytes], chunk: int, maxlen: int,
                    ready: Any, start: Any, stop: Any, counts: Any, client: str = "redis_py") -> None:
    """One producer process: ``publish_many`` chunks of ``payloads`` round-robin over ``streams`` until ``stop``;
    ``counts[index]`` = reports acknowledged so far. ``client`` ``hand_written``: the production bus
    (:func:`meridian.bus.open_bus`: redis-py's ``RedisCluster`` for the slot map, and the hand-packed publish
    on a socket per primary); ``redis_py``: :class:`~meridian.bus.redispy_bus.RedisPyStreamBus` (redis-py's
    cluster pipeline)."""
    from meridian.bus import BusUnavailableError, RedisPyStreamBus, open_bus

    buses = [open_bus(url) if client == "hand_written" else RedisPyStreamBus(url)] * len(streams)
    for bus in buses:
        bus.ping()
    ready.put(index)
    start.wait()
    sent, i = 0, 0
    chunks = [payloads[s:s + chunk] for s in range(0, len(payloads), chunk)]
    while not stop.is_set():
        k = i % len(streams)
        try:
            sent += buses[k].publish_many(streams[k], chunks[i % len(chunks)], maxlen=maxlen)
        except BusUnavailableError:
            time.sleep(0.05)
        i += 1
        counts[index] = sent
    for bus in {id(b): b for b in buses}.values():
        bus.close()


def stop_processes(stop: Any, procs: Sequence[Any], *, grace_s: float = 10.0) -> None:
    """Ask benchmark processes to stop (``stop`` event), wait ``grace_s`` each, then kill what is left."""
    stop.set()
    for p in procs:
        p.join(timeout=grace_s)
        if p.is_alive():
            p.kill()


def _cpu_s(pid: int) -> float:
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def shard_run(primaries: int, payloads: list[bytes], *, producers: int = 2, seconds: float = 5.0,
              members: Sequence[str], chunk: int = 2000, maxlen: int = 50_000, warmup_s: float = 0.5,
              pin: tuple[int, int] | None = None, client: str = "redis_py") -> dict[str, Any]:
    """One cluster size: start a ``primaries``-primary cluster, ``producers`` processes publish flat out to the
    telemetry streams of ``members`` (producer i takes every ``producers``-th stream); after ``warmup_s`` the
    window of ``seconds`` is measured. ``pin`` (redis core, producer core): pin the redis-servers and the
    producers there. The cluster is stopped before returning."""
    from meridian.bus import telemetry_stream
    from meridian.local_redis_cluster import LocalRedisCluster

    streams = [telemetry_stream(m) for m in members]
    cluster = LocalRedisCluster(primaries=primaries, replicas=0).start()
    ctx = mp.get_context("spawn")
    ready, start, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    counts = ctx.Array("q", producers)
    procs = [ctx.Process(target=_shard_producer, args=(i, cluster.url, streams[i::producers] or streams,
                                                       list(payloads), chunk, maxlen, ready, start, stop, counts,
                                                       client),
                         daemon=True) for i in range(producers)]
    try:
        ports = sorted(cluster.procs)
        per_primary = [0] * len(ports)
        for s in streams:
            per_primary[ports.index(cluster.owner_of(s))] += 1
        for p in procs:
            p.start()
        if pin is not None:
            for port in ports:
                os.sched_setaffinity(cluster.procs[port].pid, {pin[0]})
            for p in procs:
                os.sched_setaffinity(p.pid, {pin[1]})  # type: ignore[arg-type]
        for _ in procs:
            ready.get(timeout=120)
        start.set()
        time.sleep(warmup_s)
        redis_pids = [cluster.procs[port].pid for port in ports]
        producer_pids: list[int] = [p.pid for p in procs]  # type: ignore[misc]

        def snap() -> tuple[float, int, list[float], list[float]]:
            return (time.perf_counter(), sum(counts[:]), [_cpu_s(pid) for pid in redis_pids],
                    [_cpu_s(pid) for pid in producer_pids])

        t0, n0, r0, p0 = snap()
        time.sleep(seconds)
        t1, n1, r1, p1 = snap()
        alive = all(p.is_alive() for p in procs)
    finally:
        stop_processes(stop, procs)
        cluster.stop()
    window = t1 - t0
    return {
        "primaries": primaries, "producers": producers, "client": client, "window_s": round(window, 2),
        "reports": n1 - n0, "reports_per_s": round((n1 - n0) / window, 1),
        "redis_cpu_pct": [round((b - a) / window * 100, 1) for a, b in zip(r0, r1, strict=True)],
        "producer_cpu_pct": [round((b - a) / window * 100, 1) for a, b in zip(p0, p1, strict=True)],
        "streams_per_primary": per_primary, "producers_alive_at_end": alive,
        "pinned": None if pin is None else {"redis_core": pin[0], "producer_core": pin[1]},
    }


def _ratios(runs: dict[str, Any]) -> dict[str, float | None]:
    base = runs.get("1", {}).get("reports_per_s")
    return {f"ratio_{n}_to_1": (round(r["reports_per_s"] / base, 3) if base else None)
            for n, r in runs.items() if n != "1"}


def measure_shards(primaries: Sequence[int], payloads: Sequence[bytes], *, producers: int = 2, seconds: float = 5.0,
                   streams: int = 12, chunk: int = 2000, maxlen: int = 50_000, pin: bool = False,
                   warmup_s: float = 0.5, progress: Callable[[str], Any] | None = None,
                   client: str = "redis_py") -> dict[str, Any]:
    """:func:`shard_run` for each cluster size in ``primaries``; with ``pin`` (needs two usable cores) the whole
    series again with the redis-servers on the first usable core and the producers on the second. ``client``:
    ``redis_py`` (redis-py's cluster pipeline) or ``hand_written`` (the production bus, ``open_bus``).
    Keys:
    ``"<N>"`` per size, ``ratio_<N>_to_1``, ``members``, ``pinned`` (same shape, or None)."""
    members = balanced_members(streams, primaries)
    cores = sorted(os.sched_getaffinity(0))
    pin_cores = (cores[0], cores[1]) if pin and len(cores) >= 2 else None

    def series(pinned: tuple[int, int] | None) -> dict[str, Any]:
        runs: dict[str, Any] = {}
        for n in primaries:
            if progress is not None:
                progress(f"shards ({client}): {n} primar{'y' if n == 1 else 'ies'}, {producers} producers, {seconds:g} s"
                         + (f", pinned redis→core {pinned[0]}, producers→core {pinned[1]}" if pinned else "") + " …")
            runs[str(n)] = shard_run(n, list(payloads), producers=producers, seconds=seconds, members=members,
                                     chunk=chunk, maxlen=maxlen, warmup_s=warmup_s, pin=pinned, client=client)
        return {**runs, **_ratios(runs)}

    out = series(None)
    out["members"] = members
    out["client"] = client
    out["cpus"] = os.cpu_count()
    out["pinned"] = series(pin_cores) if pin_cores is not None else None
    return out
