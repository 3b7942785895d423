"""``meridian bench telemetry`` and ``meridian regional-telemetry``.

The benchmark measures, in one run on loopback:

1. **raw XADD**: how fast this machine's Redis accepts the same report payloads with pipelined
   ``XADD`` — with ``redis-benchmark`` when it is installed (same payload size, 64-deep pipeline),
   and through Meridian's own pipelined client path with pre-encoded payloads;
2. **end-to-end**: simulated agents (``--producers`` processes, each a slice of a ``--nodes`` fleet)
   encode ``NodeTelemetry`` reports and publish them, one stream entry each, while this process
   consumes the stream with :class:`~regional_scheduler.telemetry_state.TelemetryConsumer` into
   the numpy cluster state. ``reports_per_s`` counts reports *applied to the state* after a warm-up;
   ``--interval-s 0`` publishes flat out (capacity), ``--interval-s 2`` paces each node to one report
   per 2 s (the 100,000-node fleet's offered load is then 50,000/s);
3. **consumer memory**: RSS of this process sampled through the run (``--duration-s 300`` for the
   five-minute flatness check);
4. **decode**: the consumer's decode of a batch into a :class:`~meridian.telemetry.TelemetryBatch`
   (upb, one parse per report) alone and followed by its validation, without Redis, so that the
   consumer's decode cost stays visible (:func:`measure_decode`; ``--decode-seconds 0`` skips it);
5. **clients**: the hand-written RESP bus beside the redis-py (+ hiredis) bus on the same Redis and payloads,
   alternating passes, pipelined publish and XREADGROUP + XACK drain
   (:func:`~regional_scheduler.telemetry_shards_bench.measure_clients`; ``--client-seconds 0`` skips it);
6. **shards** (``--cluster-primaries 1,2,3``): producer processes publishing flat out to 12 member clusters'
   streams on a real 1-, 2-, 3-primary Redis Cluster, reports/s and each redis-server's and producer's CPU,
   then the same with redis and producers pinned to separate cores
   (:func:`~regional_scheduler.telemetry_shards_bench.measure_shards`).

Registering the commands runs on every ``meridian`` start, so redis, psutil, the bus and the
simulated fleet (numpy, kubernetes) are imported by the functions that use them; ``_producer`` runs
in a spawned process and imports what it needs itself.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import typer
from rich.console import Console
from rich.table import Table

from meridian.cli import CliRoot

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

    import redis

    from meridian.bus import RedisStreamBus
    from meridian.fleet import SimulatedFleet
    from regional_scheduler.telemetry_state import TelemetryConsumer, TelemetryState

console = Console(width=None if Console().is_terminal else 160)
DEFAULT_NODE_LIST = Path("alibaba-gpu-v2023") / "openb_node_list_all_node.csv"  # under the shared traces
BENCH_CLUSTER = "bench"


def _producer(index: int, n_producers: int, nodes: int, url: str, key_prefix: str, node_list: str | None,
              interval_s: float, chunk: int, maxlen: int, ready: mp.Queue, start: mp.Event, stop: mp.Event,
              published: mp.Value, producer_cpu_s: mp.Value) -> None:  # type: ignore[type-arg]
    """One simulated-agent process: a slice of the fleet, publishing until ``stop``."""
    from meridian.bus import BusUnavailableError, RedisStreamBus, telemetry_stream
    from meridian.fleet import SimulatedFleet

    share = nodes // n_producers + (nodes % n_producers if index == n_producers - 1 else 0)
    fleet = SimulatedFleet(cluster=BENCH_CLUSTER, region="bench", n_nodes=share, seed=index,
                           first_index=index * (nodes // n_producers), node_list=node_list)
    bus = RedisStreamBus(url, key_prefix=key_prefix)
    stream = telemetry_stream(BENCH_CLUSTER)
    ready.put(index)
    start.wait()
    cpu_started = time.process_time()
    t0, rounds = time.time(), 0
    while not stop.is_set():
        now = time.time()
        fleet.advance(now)
        for s in range(0, share, chunk):
            if stop.is_set():
                break
            if interval_s > 0:
                delay = t0 + (rounds + s / share) * interval_s - time.time()
                if delay > 0:
                    time.sleep(delay)
            payloads = fleet.reports(now, slice(s, s + chunk))
            try:
                bus.publish_many(stream, payloads, maxlen=maxlen)
            except BusUnavailableError:
                time.sleep(0.1)
                continue
            with published.get_lock():
                published.value += len(payloads)
        rounds += 1
    with producer_cpu_s.get_lock():
        producer_cpu_s.value += time.process_time() - cpu_started
    bus.close()


def _raw_xadd_python(bus: RedisStreamBus, payloads: list[bytes], seconds: float, chunk: int) -> float:
    stream = "bench:raw-xadd"
    bus.delete(stream)
    sent, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for s in range(0, len(payloads), chunk):
            sent += bus.publish_many(stream, payloads[s:s + chunk], maxlen=200_000)
    rate = sent / (time.perf_counter() - started)
    bus.delete(stream)
    return rate


def _raw_xadd_redis_benchmark(url: str, key_prefix: str, payload_bytes: int, requests: int) -> float | None:
    from meridian.bus import RedisStreamBus

    binary = shutil.which("redis-benchmark")
    parsed = urlparse(url)
    if binary is None or parsed.scheme != "redis":
        return None
    key = f"{key_prefix}bench:raw-xadd-rb"
    cmd = [binary, "-h", parsed.hostname or "127.0.0.1", "-p", str(parsed.port or 6379), "-n", str(requests),
           "-P", "64", "-q", "XADD", key, "MAXLEN", "~", "200000", "*", "p", "x" * payload_bytes]
    if parsed.password:
        cmd[1:1] = ["-a", parsed.password]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    finally:
        RedisStreamBus(url).delete(key)
    match = re.search(r"([\d.]+) requests per second", out)
    return float(match.group(1)) if match else None


def _consumer_drain(bus: RedisStreamBus, fleet: SimulatedFleet, reports: int, batch: int) -> float:
    """The consumer alone: reports/s it applies from a pre-filled stream (no producer competing)."""
    from meridian.bus import telemetry_stream
    from regional_scheduler.telemetry_state import (
        TelemetryConsumer,
        TelemetryConsumerSettings,
        TelemetryState,
    )

    stream = telemetry_stream(BENCH_CLUSTER)
    bus.delete(stream)
    settings = TelemetryConsumerSettings(cluster=BENCH_CLUSTER, group="drain", consumer="drain-0",
                                         bus={"batch": batch, "block_ms": 0}, claim_interval_s=3600, stale_after_s=3600)
    state = TelemetryState(cluster=BENCH_CLUSTER, stale_after_s=settings.stale_after_s)
    consumer = TelemetryConsumer(bus=bus, state=state, settings=settings)
    bus.publish_many(stream, fleet.reports(time.time()))  # first round: the state learns every node
    while consumer.step():
        pass
    published = 0
    while published < reports:
        fleet.advance(time.time())
        published += bus.publish_many(stream, fleet.reports(time.time()), maxlen=None)
    applied_before, started = state.applied_total, time.perf_counter()
    while consumer.step():
        pass
    rate = (state.applied_total - applied_before) / (time.perf_counter() - started)
    bus.delete(stream)
    return rate


def bench_telemetry(
    nodes: int = typer.Option(100_000, help="Simulated fleet size (split across producers)."),
    producers: int = typer.Option(1, help="Simulated-agent processes."),
    interval_s: float = typer.Option(0.0, "--interval-s", help="Report interval per node (s); 0 = flat out."),
    duration_s: float = typer.Option(20.0, "--duration-s", "--duration", help="Measured seconds after warm-up."),
    warmup_s: float = typer.Option(3.0, "--warmup-s", help="Seconds excluded from the rate at least; the warm-up "
                                   "also lasts until every node has reported once (state growth)."),
    batch: int = typer.Option(5000, help="Consumer XREADGROUP COUNT."),
    chunk: int = typer.Option(2000, help="Reports per pipelined publish."),
    raw_seconds: float = typer.Option(3.0, "--raw-seconds", help="Seconds of raw XADD measurement."),
    redis_url: str = typer.Option(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), "--redis-url"),
    node_list: Path | None = typer.Option(None, "--node-list", help="openb node list CSV for node shapes "
                                          "(default: the shared trace's all-node list when present)."),
    rss_every_s: float = typer.Option(5.0, "--rss-every-s", help="RSS sampling period (s)."),
    drain_reports: int = typer.Option(200_000, "--drain-reports", help="Reports for the consumer-alone drain "
                                      "measurement (0 = skip)."),
    decode_seconds: float = typer.Option(3.0, "--decode-seconds", help="Seconds of the consumer's decode "
                                         "measurement, without Redis (0 = skip)."),
    client_seconds: float = typer.Option(2.0, "--client-seconds", help="Seconds of pipelined publish per bus in "
                                         "the hand-written vs redis-py comparison (0 = skip the comparison)."),
    client_rounds: int = typer.Option(4, "--client-rounds", help="Alternating passes per bus in that comparison."),
    client_drain_reports: int = typer.Option(50_000, "--client-drain-reports", help="Reports per drain pass in "
                                             "that comparison (0 = publish only)."),
    cluster_primaries: str = typer.Option("", "--cluster-primaries", help="Comma-separated Redis Cluster sizes "
                                          "for the shards measurement, e.g. 1,2,3 (empty = skip)."),
    shard_producers: int = typer.Option(2, "--shard-producers", help="Producer processes in the shards measurement."),
    shard_seconds: float = typer.Option(5.0, "--shard-seconds", help="Measured seconds per cluster size."),
    shard_streams: int = typer.Option(12, "--shard-streams", help="Member clusters' telemetry streams published to."),
    shard_client: str = typer.Option("production", "--shard-client", help="Producers' client in the shards "
                                     "measurement: production (open_bus: redis-py's RedisCluster for the slot map, "
                                     "the hand-packed publish per primary), redis-py (its cluster pipeline) or both."),
    pin: bool | None = typer.Option(None, "--pin/--no-pin", help="Repeat the shards measurement with redis-servers "
                                    "pinned to one core and producers to another (default: when ≥ 2 CPUs)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON to this file."),
) -> None:
    """End-to-end node reports/s through Redis into regional state, beside raw XADD throughput."""
    from meridian.bus import RedisStreamBus

    if node_list is None:
        node_list = _default_node_list()
    key_prefix = f"bench-{os.getpid()}:"
    bus = RedisStreamBus(redis_url, key_prefix=key_prefix)
    raw = _measure_raw(bus, redis_url=redis_url, key_prefix=key_prefix, nodes=nodes, node_list=node_list,
                       raw_seconds=raw_seconds, chunk=chunk, batch=batch, drain_reports=drain_reports,
                       decode_seconds=decode_seconds)
    clients = None
    if client_seconds > 0:
        from regional_scheduler.telemetry_shards_bench import measure_clients

        with console.status(f"clients: hand-written vs redis-py, {client_rounds} alternating passes …"):
            clients = measure_clients(redis_url, raw.payloads, key_prefix=key_prefix, seconds=client_seconds,
                                      rounds=client_rounds, drain_reports=client_drain_reports, batch=batch,
                                      chunk=chunk)
    run = _end_to_end(bus, redis_url=redis_url, key_prefix=key_prefix, nodes=nodes, producers=producers,
                      interval_s=interval_s, duration_s=duration_s, warmup_s=warmup_s, batch=batch, chunk=chunk,
                      node_list=node_list, rss_every_s=rss_every_s)
    results = _results(run, raw, nodes=nodes, producers=producers, interval_s=interval_s)
    results["clients"] = clients
    results["shards"] = None
    sizes = [int(n) for n in cluster_primaries.replace(" ", "").split(",") if n]
    if sizes:
        from regional_scheduler.telemetry_shards_bench import measure_shards

        if shard_client not in ("production", "redis-py", "both"):
            raise typer.BadParameter("production, redis-py or both", param_hint="--shard-client")
        kinds = ["production", "redis-py"] if shard_client == "both" else [shard_client]
        status = console.status("shards …")
        with status:
            for kind in kinds:
                results["shards" if kind == "production" else "shards_redis_py"] = measure_shards(
                    sizes, raw.payloads, producers=shard_producers, seconds=shard_seconds, streams=shard_streams,
                    chunk=chunk, pin=(os.cpu_count() or 1) >= 2 if pin is None else pin, progress=status.update,
                    client="hand_written" if kind == "production" else "redis_py")
    _print_results(results, nodes=nodes, producers=producers, interval_s=interval_s, window=run.t_stop - run.t_warm)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(results, indent=2) + "\n")


def _default_node_list() -> Path | None:
    """The shared trace's all-node list, when the traces and it are there."""
    from meridian.traces import TracesNotFoundError, default_traces_dir

    try:
        candidate = default_traces_dir() / DEFAULT_NODE_LIST
    except TracesNotFoundError as exc:
        console.print(f"[yellow]synthetic node shapes: {exc}[/yellow]")
        return None
    return candidate if candidate.is_file() else None


@dataclass
class _RawRates:
    """What Redis and the consumer do alone, before the end-to-end run."""

    payload_bytes: int
    python: float
    redis_benchmark: float | None
    drain: float | None
    decode: DecodeRates | None = None
    payloads: list[bytes] = field(default_factory=list, repr=False)  # the sample fleet's reports


def _measure_raw(bus: RedisStreamBus, *, redis_url: str, key_prefix: str, nodes: int, node_list: Path | None,
                 raw_seconds: float, chunk: int, batch: int, drain_reports: int, decode_seconds: float) -> _RawRates:
    """Raw XADD of a sample fleet's reports (Meridian's client and redis-benchmark) and the consumer's drain."""
    from meridian.fleet import SimulatedFleet

    sample = SimulatedFleet(cluster=BENCH_CLUSTER, region="bench", n_nodes=min(nodes, 10_000), node_list=node_list)
    sample.advance(time.time())
    payloads = sample.reports(time.time())
    payload_bytes = int(sum(map(len, payloads)) / len(payloads))
    with console.status("raw XADD, consumer drain …"):
        raw_python = _raw_xadd_python(bus, payloads, raw_seconds, chunk)
        raw_rb = _raw_xadd_redis_benchmark(redis_url, key_prefix, payload_bytes,
                                           requests=max(int(raw_seconds * 300_000), 20_000))
        drain_rate = _consumer_drain(bus, sample, drain_reports, batch) if drain_reports else None
    decode = None
    if decode_seconds > 0:
        with console.status(f"decode: upb into a TelemetryBatch, {decode_seconds:g} s …"):
            decode = measure_decode(_decode_sample(sample, DECODE_SAMPLE_REPORTS), batch=batch,
                                    seconds=decode_seconds, cluster=BENCH_CLUSTER)
    return _RawRates(payload_bytes=payload_bytes, python=raw_python, redis_benchmark=raw_rb, drain=drain_rate,
                     decode=decode, payloads=payloads)


#: Reports in the decode measurement's sample (12 batches of the default 5,000).
DECODE_SAMPLE_REPORTS = 60_000


def _decode_sample(sample: SimulatedFleet, reports: int) -> list[bytes]:
    """About ``reports`` reports of ``sample``'s first nodes over one whole labels cycle, the mix a
    consumer sees in steady state: one report in ``labels_every`` carries the node's labels (they cost
    more to decode). A single round would be all labelled or all unlabelled."""
    rounds = sample.labels_every
    rows = slice(0, max(1, min(sample.n_nodes, -(-reports // rounds))))
    out: list[bytes] = []
    for _ in range(rounds):
        sample.advance(time.time())
        out += sample.reports(time.time(), rows)
    return out


@dataclass
class DecodeRates:
    """Seconds spent decoding (and validating) the same batches, over ``passes`` passes."""

    reports: int  # reports in the sample (one pass)
    batch: int
    payload_bytes: float  # mean
    labelled_fraction: float  # reports carrying the node's labels and taints
    backend: str  # protobuf's implementation: 'upb' is its C backend
    passes: int = 0
    decode_s: float = 0.0  # decode only
    validate_s: float = 0.0  # validate_batch after the decode

    def as_dict(self) -> dict[str, Any]:
        done = self.reports * self.passes
        return {
            "reports_per_s": round(done / self.decode_s, 1),
            "validated_reports_per_s": round(done / (self.decode_s + self.validate_s), 1),
            "reports": self.reports, "batch": self.batch, "passes": self.passes,
            "payload_bytes_mean": round(self.payload_bytes, 1), "labelled_fraction": round(self.labelled_fraction, 4),
            "protobuf_backend": self.backend,
        }


def measure_decode(payloads: list[bytes], *, batch: int = 5000, seconds: float = 3.0,
                   cluster: str | None = None) -> DecodeRates:
    """Decode ``payloads`` in batches of ``batch`` as the consumer does
    (:func:`meridian.telemetry.decode_batch`, upb), whole passes over the sample until ``seconds``
    have been spent decoding (one pass at least, after a warm-up pass), each batch followed by the
    consumer's :func:`~meridian.telemetry.validate_batch`, timed apart. No Redis involved."""
    from google.protobuf.internal import api_implementation

    from meridian.bus import StreamEntry
    from meridian.telemetry import Rejected, decode_batch

    if not payloads:
        raise ValueError("measure_decode needs at least one payload")
    entries = [StreamEntry(f"{i + 1}-0", p) for i, p in enumerate(payloads)]
    batches = [entries[s:s + batch] for s in range(0, len(entries), batch)]
    warm: list[Rejected] = []
    labelled = sum(len(decode_batch(b, warm)[0].labels) for b in batches)  # also the warm-up
    rates = DecodeRates(reports=len(entries), batch=batch, payload_bytes=sum(map(len, payloads)) / len(payloads),
                        labelled_fraction=labelled / len(entries), backend=api_implementation.Type())
    while rates.passes == 0 or rates.decode_s < seconds:
        decode_s, validate_s = _timed_pass(batches, cluster)
        rates.decode_s += decode_s
        rates.validate_s += validate_s
        rates.passes += 1
    return rates


def _timed_pass(batches: list[list[Any]], cluster: str | None) -> tuple[float, float]:
    """(seconds decoding, seconds validating) of one pass over ``batches``."""
    from meridian.telemetry import Rejected, decode_batch, validate_batch

    decode_s = validate_s = 0.0
    for entries in batches:
        rejected: list[Rejected] = []
        t0 = time.perf_counter()
        decoded, clusters = decode_batch(entries, rejected)
        t1 = time.perf_counter()
        validate_batch(decoded, clusters, cluster, rejected)
        decode_s, validate_s = decode_s + t1 - t0, validate_s + time.perf_counter() - t1
    return decode_s, validate_s

@dataclass
class _EndToEnd:
    """The end-to-end run's counters: at its start, at the end of the warm-up (None when it never ended)
    and at the end of the measured window; then what was left in the stream."""

    state: TelemetryState
    consumer: TelemetryConsumer
    t_start: float
    t_warm: float
    t_stop: float = 0.0
    applied_warm: int | None = None
    published_warm: int | None = None
    cpu_warm: float | None = None
    redis_cpu_warm: float | None = None
    applied_end: int = 0
    published_end: int = 0
    published_total: int = 0
    cpu_end: float = 0.0
    redis_cpu_end: float = 0.0
    producer_cpu_s: float = 0.0
    rss: list[tuple[float, float]] = field(default_factory=list)
    stream_length: int = 0
    lag: int | None = None


def _end_to_end(bus: RedisStreamBus, *, redis_url: str, key_prefix: str, nodes: int, producers: int,
                interval_s: float, duration_s: float, warmup_s: float, batch: int, chunk: int,
                node_list: Path | None, rss_every_s: float) -> _EndToEnd:
    """Producer processes publish while this process consumes into the state; closes ``bus`` at the end."""
    import redis

    from meridian.bus import telemetry_stream
    from regional_scheduler.telemetry_state import (
        TelemetryConsumer,
        TelemetryConsumerSettings,
        TelemetryState,
    )

    stream = telemetry_stream(BENCH_CLUSTER)
    bus.delete(stream)
    settings = TelemetryConsumerSettings(cluster=BENCH_CLUSTER, bus_url=redis_url, group="bench", consumer="bench-0",
                                         bus={"batch": batch, "block_ms": 200}, claim_interval_s=3600, stale_after_s=3600)
    state = TelemetryState(cluster=BENCH_CLUSTER, stale_after_s=settings.stale_after_s)
    consumer = TelemetryConsumer(bus=bus, state=state, settings=settings)
    ctx = mp.get_context("spawn")
    ready, start, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    published = ctx.Value("q", 0)
    producer_cpu_s = ctx.Value("d", 0.0)
    redis_info = redis.Redis.from_url(redis_url)
    maxlen = max(4 * nodes, 200_000)
    procs = [ctx.Process(target=_producer, args=(i, producers, nodes, redis_url, key_prefix,
                                                 str(node_list) if node_list else None, interval_s, chunk, maxlen,
                                                 ready, start, stop, published, producer_cpu_s), daemon=True)
             for i in range(producers)]
    try:
        for p in procs:
            p.start()
        with console.status(f"building {nodes:,} simulated nodes in {producers} producer(s) …"):
            for _ in procs:
                ready.get(timeout=300)
        start.set()
        run = _EndToEnd(state=state, consumer=consumer, t_start=time.perf_counter(), t_warm=0.0)
        with console.status(f"end-to-end: warm-up (≥ {warmup_s:g} s, every node seen), then {duration_s:g} s …"):
            _measure_window(run, published, redis_info, nodes=nodes, warmup_s=warmup_s, duration_s=duration_s,
                            rss_every_s=rss_every_s)
    finally:
        from regional_scheduler.telemetry_shards_bench import stop_processes

        stop_processes(stop, procs)
        stream_length = bus.length(stream)
        lag = None
        try:  # entries not yet delivered to the group (Redis ≥ 7) plus delivered but unacknowledged
            groups = redis_info.xinfo_groups(key_prefix + stream)
            lag = sum(int(g.get("lag") or 0) + int(g.get("pending") or 0) for g in groups)
        except redis.exceptions.RedisError:
            pass
        bus.delete(stream)
        bus.close()
    run.stream_length, run.lag = stream_length, lag
    run.producer_cpu_s = producer_cpu_s.value
    return run


def _measure_window(run: _EndToEnd, published: Synchronized[int], redis_info: redis.Redis, *, nodes: int,
                    warmup_s: float, duration_s: float, rss_every_s: float) -> None:
    """Consume through the warm-up (at least ``warmup_s``, until every node is in the state) and then
    ``duration_s`` more, sampling the RSS; records the counters in ``run``."""
    import psutil

    def redis_cpu_s() -> float:
        info = redis_info.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    me = psutil.Process()
    state, t_start = run.state, run.t_start
    run.t_warm = t_start + warmup_s
    t_end = float("inf")
    give_up_warmup = run.t_warm + 300.0  # a consumer that cannot see every node in 5 minutes is measured as is
    next_rss = t_start
    while (now := time.perf_counter()) < t_end:
        if run.applied_warm is None and now >= run.t_warm and (state.state.n_nodes >= nodes or now > give_up_warmup):
            run.applied_warm, run.published_warm = state.applied_total, published.value
            run.cpu_warm = sum(me.cpu_times()[:2])
            run.redis_cpu_warm = redis_cpu_s()
            run.t_warm = now
            t_end = run.t_warm + duration_s
        if now >= next_rss:
            run.rss.append((now - t_start, me.memory_info().rss / 2**20))
            next_rss = now + rss_every_s
        run.consumer.step()
    run.t_stop = time.perf_counter()
    run.applied_end, run.published_end = state.applied_total, published.value
    run.cpu_end = sum(me.cpu_times()[:2])
    run.redis_cpu_end = redis_cpu_s()
    run.published_total = published.value
    run.rss.append((run.t_stop - t_start, me.memory_info().rss / 2**20))


def _results(run: _EndToEnd, raw: _RawRates, *, nodes: int, producers: int, interval_s: float) -> dict[str, Any]:
    """The benchmark's figures, as written to ``--json``."""
    window = run.t_stop - run.t_warm
    applied = run.applied_end - (run.applied_warm or 0)
    reports_per_s = applied / window
    consumer_us = (run.cpu_end - (run.cpu_warm or 0)) / max(applied, 1) * 1e6
    # The producers' CPU covers their whole run (warm-up included), per report they published.
    producer_us = run.producer_cpu_s / max(run.published_total, 1) * 1e6
    published_window = run.published_end - (run.published_warm or 0)
    # Redis serves both sides; its CPU per report is per report published in the window.
    redis_us = (run.redis_cpu_end - (run.redis_cpu_warm or run.redis_cpu_end)) / max(published_window, 1) * 1e6
    total_us = consumer_us + producer_us + redis_us
    rss = run.rss
    warm_at = run.t_warm - run.t_start
    rss_warm = next((m for t, m in rss if t >= warm_at), rss[-1][1])
    raw_rb, raw_python = raw.redis_benchmark, raw.python
    return {
        "nodes": nodes, "producers": producers, "interval_s": interval_s, "duration_s": round(window, 2),
        "warmup_s": round(run.t_warm - run.t_start, 2),
        "payload_bytes_mean": raw.payload_bytes,
        "reports_per_s": round(reports_per_s, 1),
        "published_per_s": round((run.published_end - (run.published_warm or 0)) / window, 1),
        "raw_xadd_per_s": round(raw_rb if raw_rb is not None else raw_python, 1),
        "raw_xadd_method": "redis-benchmark -P 64" if raw_rb is not None else "meridian pipelined publish_many",
        "raw_xadd_python_per_s": round(raw_python, 1),
        "raw_xadd_redis_benchmark_per_s": round(raw_rb, 1) if raw_rb is not None else None,
        "consumer_drain_reports_per_s": round(raw.drain, 1) if raw.drain is not None else None,
        # The consumer's decode alone (upb into a TelemetryBatch), with and without validation.
        "decode": raw.decode.as_dict() if raw.decode is not None else None,
        "ratio_to_raw_xadd": round(reports_per_s / (raw_rb if raw_rb is not None else raw_python), 3),
        "consumer_cpu_us_per_report": round(consumer_us, 2),
        "producer_cpu_us_per_report": round(producer_us, 2),
        "redis_cpu_us_per_report": round(redis_us, 2),
        "total_cpu_us_per_report": round(total_us, 2),
        # What two otherwise idle cores could carry if the three processes shared them perfectly.
        "cpu_bound_reports_per_s_on_2_cores": round(2e6 / total_us, 1) if total_us > 0 else None,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "consumer_rss_mb": round(rss[-1][1], 1),
        "consumer_rss_mb_after_warmup": round(rss_warm, 1),
        # Growth of the consumer's RSS per minute over the measured window (flat memory: ~0).
        "consumer_rss_mb_per_min": round((rss[-1][1] - rss_warm) / max(window, 1e-9) * 60, 2),
        "consumer_rss_mb_max": round(max(m for _, m in rss), 1),
        "rss_samples_mb": [[round(t, 1), round(m, 1)] for t, m in rss],
        "nodes_in_state": run.state.state.n_nodes,
        "duplicates": run.state.duplicate_total,
        "dead_lettered": run.consumer.dead_lettered_total,
        "stream_length_at_end": run.stream_length,
        "consumer_lag_at_end": run.lag,
        "cpus": os.cpu_count(),
    }


def _print_results(results: dict[str, Any], *, nodes: int, producers: int, interval_s: float, window: float) -> None:
    table = Table(title=f"telemetry fabric: {nodes:,} simulated nodes, {producers} producer(s), "
                  f"interval {interval_s or 'flat out'} s, {window:.0f} s measured")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("reports_per_s", "published_per_s", "consumer_drain_reports_per_s", "raw_xadd_per_s", "raw_xadd_python_per_s",
                "raw_xadd_redis_benchmark_per_s", "ratio_to_raw_xadd", "consumer_cpu_us_per_report",
                "producer_cpu_us_per_report", "redis_cpu_us_per_report", "total_cpu_us_per_report",
                "cpu_bound_reports_per_s_on_2_cores", "load_average_1m",
                "consumer_rss_mb_after_warmup", "consumer_rss_mb", "consumer_rss_mb_max", "consumer_rss_mb_per_min",
                "warmup_s", "nodes_in_state",
                "stream_length_at_end", "consumer_lag_at_end", "dead_lettered"):
        value = results[key]
        table.add_row(key, f"{value:,.1f}" if isinstance(value, float) else str(value))
    for key, value in (results["decode"] or {}).items():
        shown = (f"{value:,.1f}" if value >= 100 else f"{value:.3f}") if isinstance(value, float) else str(value)
        table.add_row(f"decode.{key}", shown)
    console.print(table)
    if results.get("clients"):
        _print_clients(results["clients"])
    for key in ("shards", "shards_redis_py"):
        if results.get(key):
            _print_shards(results[key])


def _print_clients(clients: dict[str, Any]) -> None:
    table = Table(title=f"bus clients on one Redis, reports/s ({clients['rounds']} alternating passes each; "
                  f"redis-py {clients['redis_py']}, hiredis {clients['hiredis']})")
    for column in ("path", "hand-written", "redis-py", "ratio (hand-written / redis-py)"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for path in ("publish", "drain"):
        row = clients.get(path)
        if row:
            table.add_row(path, f"{row['hand_written']:,.0f}", f"{row['redis_py']:,.0f}", f"{row['ratio']:.2f}")
    console.print(table)


def _print_shards(shards: dict[str, Any]) -> None:
    table = Table(title=f"Redis Cluster telemetry publish ({shards['client'].replace('_', '-')} producers): "
                  f"{len(shards['members'])} member streams, "
                  f"{shards['cpus']} CPUs (CPU: % of one core over the window)")
    for column in ("run", "primaries", "streams/primary", "reports/s", "× 1 primary", "redis CPU %", "producer CPU %"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for label, series in (("unpinned", shards), ("pinned", shards.get("pinned"))):
        if not series:
            continue
        if label == "pinned":
            first = next(v for v in series.values() if isinstance(v, dict))
            label = f"pinned r{first['pinned']['redis_core']}/p{first['pinned']['producer_core']}"
        for key, run in series.items():
            if not isinstance(run, dict) or "reports_per_s" not in run:
                continue
            ratio = series.get(f"ratio_{key}_to_1")
            table.add_row(label, key, " ".join(map(str, run["streams_per_primary"])), f"{run['reports_per_s']:,.0f}",
                          "1.00" if key == "1" else (f"{ratio:.2f}" if ratio is not None else "–"),
                          " ".join(f"{c:.0f}" for c in run["redis_cpu_pct"]),
                          " ".join(f"{c:.0f}" for c in run["producer_cpu_pct"]))
    console.print(table)


def regional_telemetry(
    cluster: str = typer.Option(None, help="Cluster to consume (default: MERIDIAN_TELEMETRY_CLUSTER)."),
    bus_url: str = typer.Option(None, "--bus-url", help="Redis URL or memory:// (default: settings)."),
    region: str = typer.Option(None, help="Region for the summaries (default: MERIDIAN_SUMMARY_REGION)."),
    metrics_port: int | None = typer.Option(None, "--metrics-port", help="Serve /metrics here (default: settings)."),
) -> None:
    """Consume a cluster's telemetry into regional state and publish cluster summaries until Ctrl-C."""
    from meridian.bus import telemetry_stream
    from meridian.observability import MetricsSettings, start_metrics_server
    from regional_scheduler.summary_publisher import RegionalTelemetry, SummarySettings
    from regional_scheduler.telemetry_state import TelemetryConsumerSettings

    overrides = {k: v for k, v in {"cluster": cluster, "bus_url": bus_url}.items() if v is not None}
    settings = TelemetryConsumerSettings(**overrides)
    summary_settings = SummarySettings(**({"region": region} if region else {}))
    metrics = start_metrics_server(MetricsSettings(**({"port": metrics_port} if metrics_port is not None else {})))
    regional = RegionalTelemetry(settings=settings, summary=summary_settings).start()
    console.print(f"consuming {telemetry_stream(settings.cluster)} as {settings.group}/{settings.consumer}; "
                  f"summaries every {summary_settings.interval_s:g} s" + (f"; metrics on :{metrics.port}" if metrics else ""))
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        regional.close()
        if metrics is not None:
            metrics.shutdown()


def register(cli: CliRoot) -> None:
    """Add ``bench telemetry`` and ``regional-telemetry`` to the ``meridian`` CLI."""
    cli.bench.command("telemetry")(bench_telemetry)
    cli.app.command("regional-telemetry")(regional_telemetry)
