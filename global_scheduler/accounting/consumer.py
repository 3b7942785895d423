"""The accounting consumer: energy records from the ``meridian:energy`` stream into the Redis ledger.

One worker per stream and consumer group, like the other stream consumers. Each poll first claims
entries another consumer left pending for longer than ``claim_idle_ms`` (a dead global scheduler's
work, ``XAUTOCLAIM``), then reads new ones; every entry is decoded, validated, applied to the ledger
and only then acknowledged. Its stream settings (``batch``, ``block_ms``, ``claim_idle_ms``, ``backoff_s``)
are a :class:`~meridian.bus.settings.ConsumerSettings`, :data:`AccountingBus` by default.

Why a restart loses nothing and double-applies nothing: an entry is acknowledged only after the
ledger applied it, so a consumer killed before that leaves it pending and the next consumer claims it;
the ledger applies each ``record_id`` at most once (see :mod:`.ledger`), so a consumer killed between
apply and acknowledge, or a producer that sent a record twice, costs one harmless redelivery. A
payload that does not decode or that the ledger refuses goes to the dead-letter stream with the reason
and is acknowledged: one bad record never stops the ledger.

Hazards: ``claim_idle_ms`` must exceed the longest time a live consumer holds a batch, or two
consumers apply the same entries concurrently (still once each, thanks to the record ids, but wasted
work). Records are applied in delivery order, which need not be time order; the bucketed sums do not
care.

Producers build records with :func:`summary_interval_record` (from two consecutive
``ClusterSummary`` messages of a cluster) or directly, and send them with :func:`publish_records`.
Without a producer, :class:`SummaryAccountant` derives the records from the regional summaries stream
itself and applies them; :func:`start_accounting` runs either worker in a thread.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis
from google.protobuf.message import DecodeError

from global_scheduler.accounting.ledger import LedgerError, RedisLedger, quarantine_share_names
from global_scheduler.accounting.table import INVALID_NAME
from meridian import energy, observability
from meridian.bus import StreamBus, open_bus, redis_client
from meridian.bus.base import BusUnavailableError, StreamEntry
from meridian.bus.consumer import run_with_backoff
from meridian.bus.health import GroupGauges
from meridian.bus.settings import ConsumerSettings
from meridian.bus.streams import SUMMARY_STREAM
from protos import energy_pb2, telemetry_pb2

log = logging.getLogger(__name__)

ENERGY_STREAM = "meridian:energy"
ACCOUNTING_GROUP = "accounting"
ENERGY_STREAM_MAXLEN = 1_000_000
AccountingBus = ConsumerSettings.tailored("AccountingBus", block_ms=1000, backoff_s=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0))
"""The accounting workers' stream settings: a 1 s wait (nothing is in a hurry: records are summed by the minute)
and a first retry after 0.1 s; the other defaults are every consumer's."""


def _accounting_bus(settings: ConsumerSettings | Mapping[str, Any] | None) -> ConsumerSettings:
    """``settings`` as given, or the accounting defaults changed by a mapping of fields (``{"batch": 50}``)."""
    if isinstance(settings, ConsumerSettings):
        return settings
    return AccountingBus.model_validate(settings or {})


@dataclass
class PollStats:
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0

    @property
    def seen(self) -> int:
        return self.applied + self.duplicates + self.dead_lettered


class AccountingConsumer:
    """Apply energy records from a stream to a :class:`RedisLedger` (module doc)."""

    def __init__(self, *, bus: StreamBus, ledger: RedisLedger, consumer: str, stream: str = ENERGY_STREAM,
                 group: str = ACCOUNTING_GROUP, settings: ConsumerSettings | Mapping[str, Any] | None = None,
                 throttle_s: float = 0.0) -> None:
        self.bus = bus
        self.ledger = ledger
        self.consumer = consumer
        self.stream = stream
        self.group = group
        self.settings = _accounting_bus(settings)  # batch, block_ms, claim_idle_ms, backoff_s
        self.throttle_s = throttle_s  # slows each record down; only fault tests set it
        self.bus.ensure_group(stream, group, start_id="0")
        self._gauges = GroupGauges(bus, stream, group)

    def _handle(self, entry: StreamEntry, stats: PollStats) -> None:
        try:
            record = energy_pb2.EnergyRecord.FromString(entry.payload)
            _quarantine(record, self.stream)
            fresh = self.ledger.apply(record)
        except (DecodeError, LedgerError) as exc:
            reason = "decode" if isinstance(exc, DecodeError) else "invalid"
            self.bus.dead_letter(self.stream, entry, reason=f"{reason}: {exc}", group=self.group,
                                 consumer=self.consumer)
            observability.STREAM_DEAD_LETTERS.labels(stream=self.stream, reason=reason).inc()
            observability.ACCOUNTING_RECORDS.labels(outcome="invalid").inc()
            stats.dead_lettered += 1
        else:
            if fresh:
                stats.applied += 1
                observability.ACCOUNTING_RECORDS.labels(outcome="applied").inc()
                self._export(record)
            else:
                stats.duplicates += 1
                observability.ACCOUNTING_RECORDS.labels(outcome="duplicate").inc()
        # Acknowledge only now: everything above either applied the record or parked it.
        self.bus.ack(self.stream, self.group, [entry.entry_id])

    @staticmethod
    def _export(record: energy_pb2.EnergyRecord) -> None:
        it_j = record.it_energy_joules
        observability.record_region_energy(
            record.region, it_energy_joules=it_j,
            facility_energy_joules=float(energy.facility_energy_joules(it_j, record.pue)),
            carbon_grams=float(energy.carbon_grams(it_j, record.pue, record.carbon_g_per_kwh)),
            cost=float(energy.energy_cost(it_j, record.pue, record.price_per_mwh)))
        if record.unknown_seconds > 0:
            observability.ENERGY_UNKNOWN.labels(region=record.region, cluster=record.cluster).inc(
                record.unknown_seconds)

    def poll_once(self, *, block: bool = True) -> PollStats:
        """Claim stale entries, read new ones, apply and acknowledge them; returns what happened."""
        stats = PollStats()
        entries = self.bus.claim_stale(self.stream, self.group, self.consumer, min_idle_ms=self.settings.claim_idle_ms,
                                       count=self.settings.batch)
        if not entries:
            entries = self.bus.read_group(self.stream, self.group, self.consumer, count=self.settings.batch,
                                          block_ms=self.settings.block_ms if block else None)
        for entry in entries:
            self._handle(entry, stats)
            if self.throttle_s:
                time.sleep(self.throttle_s)
        self._gauges.maybe_update()
        return stats

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; back off over ``settings.backoff_s`` while Redis is unreachable."""
        def say(exc: Exception, delay: float) -> None:
            log.warning("accounting consumer %s: %s; retrying in %.2fs", self.consumer, exc, delay)

        run_with_backoff(stop, self.poll_once, delays=self.settings.backoff_s, on_failure=say,
                         retry_on=(BusUnavailableError, redis.exceptions.ConnectionError))


def _quarantine(record: energy_pb2.EnergyRecord, stream: str) -> None:
    """Keep a record whose share names are bad, charging those shares to ``(invalid-name)``."""
    bad = quarantine_share_names(record)
    if bad:
        observability.ACCOUNTING_INVALID_NAMES.inc(bad)
        log.warning("%s: %d shares of %s had names the ledger cannot key; kept as %s",
                    stream, bad, record.record_id, INVALID_NAME)


def publish_records(bus: StreamBus, records: Sequence[energy_pb2.EnergyRecord], *,
                    stream: str = ENERGY_STREAM) -> int:
    return bus.publish_many(stream, [r.SerializeToString() for r in records], maxlen=ENERGY_STREAM_MAXLEN)


def summary_interval_record(prev: telemetry_pb2.ClusterSummary, cur: telemetry_pb2.ClusterSummary, *,
                            price_per_mwh: float, max_gap_s: float = 300.0,
                            shares: Sequence[energy_pb2.EnergyShare] | None = None) -> energy_pb2.EnergyRecord:
    """The energy record for the interval between two consecutive summaries of one cluster.

    ``shares`` None: shared out from ``prev``'s holdings (what ran during the interval) by
    :func:`holding_shares`; a summary without holdings leaves it all to ``(idle)``.

    Energy is the increase of the summed node counters (``energy_joules``); when the sum fell (an agent
    restarted, a node left) it is the trapezoid of the two power readings instead. An interval longer
    than ``max_gap_s`` is unknown (:mod:`meridian.energy` gap policy). Intensity and PUE are the
    interval's mean of the two summaries; the price is the caller's, for the interval's hour.
    """
    dt_s = (cur.generated_unix_ms - prev.generated_unix_ms) / 1000.0
    if dt_s <= 0:
        raise LedgerError(f"summaries of {cur.cluster} are not in time order")
    delta = energy.counter_increments_joules([prev.energy_joules, cur.energy_joules])
    it_j = float(delta.increments_joules[0])
    # A cluster that reports power but no energy counter (a simulated cluster, or agents without RAPL
    # whose summaries carry zero) is integrated from its power readings like a counter reset.
    no_counter = prev.energy_joules == 0 and cur.energy_joules == 0
    if delta.resets or no_counter:
        it_j = float(energy.trapezoid_intervals_joules([0.0, dt_s], [prev.power_watts, cur.power_watts],
                                                       max_gap_s=float("inf"))[0])
    unknown_s = 0.0
    if dt_s > max_gap_s:
        it_j, unknown_s, shares = 0.0, dt_s, ()
    if shares is None:
        idle_j = 0.5 * (prev.idle_power_watts + cur.idle_power_watts) * dt_s
        shares = holding_shares(prev, it_joules=it_j, idle_joules=idle_j, dt_s=dt_s)
    return energy_pb2.EnergyRecord(
        record_id=f"{cur.cluster}:summary:{cur.sequence}:{cur.generated_unix_ms}", region=cur.region,
        cluster=cur.cluster, start_unix_ms=prev.generated_unix_ms, end_unix_ms=cur.generated_unix_ms,
        it_energy_joules=it_j, unknown_seconds=unknown_s, pue=max(1.0, 0.5 * (prev.pue + cur.pue)),
        carbon_g_per_kwh=0.5 * (prev.carbon_g_per_kwh + cur.carbon_g_per_kwh), price_per_mwh=price_per_mwh,
        shares=list(shares))


def holding_shares(summary: telemetry_pb2.ClusterSummary, *, it_joules: float, idle_joules: float,
                   dt_s: float) -> list[energy_pb2.EnergyShare]:
    """A cluster's energy over an interval shared out to the workloads it held (:mod:`meridian.energy`,
    "Attribution", the cluster taken as one node): idle energy by CPU requests over allocatable CPU (the
    unrequested rest stays ``(idle)``), the dynamic rest by CPU requests among the workloads, since a summary
    carries requests, not measured per-workload CPU time. Shares plus the remainder equal ``it_joules``."""
    held = list(summary.holdings)
    if not held or it_joules <= 0:
        return []
    req_cores = np.maximum(np.array([h.milli_cpu for h in held], dtype=np.float64), 0.0) / 1000.0
    split = energy.attribute_node_energy(
        node_energy_joules=[it_joules], node_idle_joules=[max(0.0, idle_joules)],
        node_allocatable_cpu_cores=[summary.allocatable.milli_cpu / 1000.0], pod_node_index=np.zeros(len(held)),
        pod_cpu_core_seconds=req_cores * dt_s, pod_requested_cpu_cores=req_cores)
    return [energy_pb2.EnergyShare(tenant=h.tenant, workload=h.workload, it_energy_joules=float(j))
            for h, j in zip(held, split.pod_joules, strict=True) if j > 0]


PriceLookup = Callable[[str, float], float]
"""(region, unix seconds) -> price per MWh in force then."""


class SummaryAccountant:
    """Energy from the regional summaries stream straight into the ledger (no energy stream needed).

    Reads ``meridian:summary`` with its own consumer group (every group sees every summary, so the
    registry's group is untouched). For each summary it loads the cluster's previous summary from Redis
    (``{ledger prefix}energy:last-summary``), applies :func:`summary_interval_record` to the ledger, stores
    this summary as the previous one, and acknowledges. A crash anywhere in between repeats the same
    record id on redelivery, which the ledger ignores; so a restart loses and doubles nothing. A summary
    older than the stored one (a claimed straggler) is acknowledged without effect: the newer interval's
    counter increase already covers its time.
    """

    def __init__(self, *, bus: StreamBus, ledger: RedisLedger, consumer: str, price_per_mwh: PriceLookup,
                 stream: str = SUMMARY_STREAM, group: str = "accounting-summaries",
                 settings: ConsumerSettings | Mapping[str, Any] | None = None, max_gap_s: float = 300.0) -> None:
        self.bus, self.ledger, self.consumer = bus, ledger, consumer
        self.price_per_mwh = price_per_mwh
        self.stream, self.group, self.settings = stream, group, _accounting_bus(settings)
        self.max_gap_s = max_gap_s
        self._last_key = f"{ledger.prefix}energy:last-summary"
        self.bus.ensure_group(stream, group, start_id="0")
        self._gauges = GroupGauges(bus, stream, group)
        self.throttle_s = 0.0

    def _handle(self, entry: StreamEntry, stats: PollStats) -> None:
        try:
            cur = telemetry_pb2.ClusterSummary.FromString(entry.payload)
            if not cur.cluster or not cur.region:
                raise LedgerError("summary without cluster or region")
            raw = self.ledger.client.hget(self._last_key, cur.cluster)
            prev = telemetry_pb2.ClusterSummary.FromString(raw) if raw else None
            if prev is not None and cur.generated_unix_ms <= prev.generated_unix_ms:
                stats.duplicates += 1
            else:
                if prev is not None:
                    record = summary_interval_record(
                        prev, cur, max_gap_s=self.max_gap_s,
                        price_per_mwh=self.price_per_mwh(cur.region, prev.generated_unix_ms / 1000.0))
                    _quarantine(record, self.stream)
                    if self.ledger.apply(record):
                        stats.applied += 1
                        AccountingConsumer._export(record)
                    else:
                        stats.duplicates += 1
                self.ledger.client.hset(self._last_key, cur.cluster, entry.payload)
        except (DecodeError, LedgerError) as exc:
            reason = "decode" if isinstance(exc, DecodeError) else "invalid"
            self.bus.dead_letter(self.stream, entry, reason=f"{reason}: {exc}", group=self.group,
                                 consumer=self.consumer)
            observability.STREAM_DEAD_LETTERS.labels(stream=self.stream, reason=reason).inc()
            stats.dead_lettered += 1
        self.bus.ack(self.stream, self.group, [entry.entry_id])

    # The same claim → read → handle → acknowledge loop as the energy-stream consumer, over summaries.
    poll_once = AccountingConsumer.poll_once
    run = AccountingConsumer.run


def start_accounting(worker: AccountingConsumer | SummaryAccountant, *, name: str = "energy-accounting"
                     ) -> tuple[threading.Thread, threading.Event]:
    """Run a worker in a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), name=name, daemon=True)
    thread.start()
    return thread, stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the accounting consumer until killed.")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="ACL user, password file and TLS "
                        "files also from MERIDIAN_REDIS_* (the user meridian-accounting: deploy/redis/users.acl)")
    parser.add_argument("--key-prefix", default="", help="extra prefix before every key (tests isolate with it)")
    parser.add_argument("--consumer", default="accounting-0")
    parser.add_argument("--bucket-s", type=int, default=60)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--claim-idle-ms", type=int, default=30_000)
    parser.add_argument("--throttle-s", type=float, default=0.0, help="sleep per record (fault tests)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    bus = open_bus(args.redis_url, key_prefix=args.key_prefix)
    ledger = RedisLedger(redis_client(args.redis_url), prefix=f"{args.key_prefix}meridian:",
                         bucket_s=args.bucket_s)
    consumer = AccountingConsumer(bus=bus, ledger=ledger, consumer=args.consumer, throttle_s=args.throttle_s,
                                  settings={"batch": args.batch, "claim_idle_ms": args.claim_idle_ms})
    consumer.run(threading.Event())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
