"""The Redis ledger and its stream consumer on real Redis: once per record, across consumer restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import redis

from global_scheduler.accounting.consumer import (
    ACCOUNTING_GROUP,
    ENERGY_STREAM,
    AccountingConsumer,
    SummaryAccountant,
    publish_records,
    summary_interval_record,
)
from global_scheduler.accounting.ledger import LedgerError, RedisLedger
from global_scheduler.accounting.report import ReportQuery, build_report
from meridian.bus import open_bus
from meridian.bus.streams import SUMMARY_STREAM
from meridian.envtest import wait_for
from protos import energy_pb2, telemetry_pb2

T0_S = (int(time.time()) // 3600 - 24) * 3600  # a day ago, on an hour: inside the retention


def _record(i: int, *, cluster: str = "c1", region: str = "r1", seconds: int = 30, joules: float = 3000.0,
            intensity: float = 100.0, price: float = 50.0) -> energy_pb2.EnergyRecord:
    start_ms = (T0_S + i * seconds) * 1000
    return energy_pb2.EnergyRecord(
        record_id=f"{cluster}:boot:{i}", region=region, cluster=cluster, start_unix_ms=start_ms,
        end_unix_ms=start_ms + seconds * 1000, it_energy_joules=joules, pue=1.2, carbon_g_per_kwh=intensity,
        price_per_mwh=price, shares=[energy_pb2.EnergyShare(tenant="t", workload="w", it_energy_joules=joules / 3)])


def _records(n: int) -> list[energy_pb2.EnergyRecord]:
    rng = np.random.default_rng(3)
    return [_record(i, cluster=f"c{i % 3}", region=f"r{i % 2}", joules=float(rng.uniform(100, 9000)),
                    intensity=float(rng.uniform(5, 500))) for i in range(n)]


def _expected_carbon_kg(records: list[energy_pb2.EnergyRecord]) -> float:
    return sum(r.it_energy_joules * r.pue / 3.6e6 * r.carbon_g_per_kwh for r in records) / 1000


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_apply_once_and_split_across_buckets(client, key_prefix):
    ledger = RedisLedger(client, prefix=f"{key_prefix}meridian:", bucket_s=60)
    # 90 s from T0+30: 30 s in the first minute, 60 s in the second → 1/3 and 2/3 of 9000 J
    rec = energy_pb2.EnergyRecord(record_id="x", region="r", cluster="c", start_unix_ms=(T0_S + 30) * 1000,
                                  end_unix_ms=(T0_S + 120) * 1000, it_energy_joules=9000.0, pue=1.0,
                                  carbon_g_per_kwh=360.0, price_per_mwh=100.0)
    assert ledger.apply(rec) is True
    assert ledger.apply(rec) is False  # redelivery: nothing added
    table = ledger.table()
    np.testing.assert_allclose(sorted(table.it_energy_joules), [3000.0, 6000.0])
    report = build_report(ledger)
    assert report.totals.carbon_kg == pytest.approx(9000 / 3.6e6 * 360 / 1000)
    assert report.totals.cost == pytest.approx(9000 / 3.6e9 * 100)
    assert ledger.regions() == ["r"] and ledger.clusters() == ["c"]


@pytest.mark.parametrize(("change", "message"), [
    pytest.param({"record_id": ""}, "record_id", id="no-id"),
    pytest.param({"end_unix_ms": 0}, "not after", id="empty-interval"),
    pytest.param({"cluster": "a|b"}, "free of", id="separator-in-name"),
    pytest.param({"pue": 0.5}, "below 1", id="pue-below-one"),
    pytest.param({"it_energy_joules": 100.0}, "exceed", id="shares-exceed-energy"),
    pytest.param({"start_unix_ms": 1000, "end_unix_ms": 2000}, "retention", id="older-than-retention"),
])
def test_ledger_refuses_bad_records(client, key_prefix, change, message):
    ledger = RedisLedger(client, prefix=f"{key_prefix}meridian:")
    rec = _record(0)
    for k, v in change.items():
        setattr(rec, k, v)
    with pytest.raises(LedgerError, match=message):
        ledger.apply(rec)


def test_bucket_size_is_fixed_by_the_first_user(client, key_prefix):
    RedisLedger(client, prefix=f"{key_prefix}meridian:", bucket_s=60)
    with pytest.raises(ValueError, match="uses 60 s buckets"):
        RedisLedger(client, prefix=f"{key_prefix}meridian:", bucket_s=300)


def test_consumer_dead_before_apply_loses_nothing(client, redis_url, key_prefix):
    bus = open_bus(redis_url, key_prefix=key_prefix)
    ledger = RedisLedger(client, prefix=f"{key_prefix}meridian:")
    records = _records(60)
    publish_records(bus, records)
    publish_records(bus, records[:5])           # a producer retry: same record ids again
    bus.publish(ENERGY_STREAM, b"\x08\xff\xff")  # garbage
    dead = AccountingConsumer(bus=bus, ledger=ledger, consumer="dead", settings={"batch": 20})
    taken = bus.read_group(ENERGY_STREAM, ACCOUNTING_GROUP, "dead", count=20)  # read, then "crash"
    assert len(taken) == 20
    # and one that applied without acknowledging (killed between the two steps)
    dead.ledger.apply(energy_pb2.EnergyRecord.FromString(taken[0].payload))
    survivor = AccountingConsumer(bus=bus, ledger=ledger, consumer="survivor",
                                  settings={"batch": 50, "claim_idle_ms": 0})
    totals = [0, 0, 0]
    for _ in range(10):
        stats = survivor.poll_once(block=False)
        totals = [totals[0] + stats.applied, totals[1] + stats.duplicates, totals[2] + stats.dead_lettered]
        if stats.seen == 0:
            break
    assert totals == [59, 6, 1]  # 60 records, one already applied by the dead one; 5 retries; 1 garbage
    assert bus.pending(ENERGY_STREAM, ACCOUNTING_GROUP) == 0
    assert bus.length(ENERGY_STREAM + ":dead") == 1
    assert build_report(ledger).totals.carbon_kg == pytest.approx(_expected_carbon_kg(records), rel=1e-9)


def _spawn(redis_url: str, key_prefix: str, name: str, throttle_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "global_scheduler.accounting.consumer", "--redis-url", redis_url, "--key-prefix",
         key_prefix, "--consumer", name, "--batch", "25", "--claim-idle-ms", "0", "--throttle-s", str(throttle_s)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ | {"PYTHONUNBUFFERED": "1"})


def test_killed_consumer_process_restarts_without_loss_or_double_count(redis_server):
    """SIGKILL a consumer process mid-run, start another: totals equal the records sent, exactly."""
    url, prefix = redis_server.url, "kill:"
    client = redis.Redis.from_url(url)
    bus = open_bus(url, key_prefix=prefix)
    records = _records(300)
    publish_records(bus, records)
    ledger = RedisLedger(client, prefix=f"{prefix}meridian:")
    # Throttled (300 records take the first consumer at least 6 s) so that the kill lands mid-run.
    first = _spawn(url, prefix, "first", throttle_s=0.02)
    applied = lambda: sum(client.scard(k) for k in client.scan_iter(f"{prefix}meridian:energy:applied:*"))  # noqa: E731
    try:
        wait_for(lambda: applied() >= 50, timeout=60, interval=0.01, message="the first consumer to apply 50 records")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    assert applied() < len(records), "the kill came too late to test anything"
    second = _spawn(url, prefix, "second", throttle_s=0.0)
    try:
        wait_for(lambda: applied() == len(records) and bus.pending(ENERGY_STREAM, ACCOUNTING_GROUP) == 0, timeout=60,
                 message="the second consumer to apply every record and acknowledge it")
    finally:
        second.terminate()
        second.wait(timeout=10)
    report = build_report(ledger)
    assert report.totals.energy_kwh == pytest.approx(sum(r.it_energy_joules for r in records) / 3.6e6, rel=1e-9)
    assert report.totals.carbon_kg == pytest.approx(_expected_carbon_kg(records), rel=1e-9)
    client.close()


def _summary(seq: int, t_ms: int, energy_j: float, power_w: float) -> telemetry_pb2.ClusterSummary:
    return telemetry_pb2.ClusterSummary(cluster="c", region="r", sequence=seq, generated_unix_ms=t_ms,
                                        energy_joules=energy_j, power_watts=power_w, carbon_g_per_kwh=200.0,
                                        pue=1.2)


@pytest.mark.parametrize(("prev", "cur", "it_joules", "unknown_s"), [
    pytest.param((1, 0, 1000.0, 100.0), (2, 10_000, 2000.0, 100.0), 1000.0, 0.0, id="counter-delta"),
    # the summed counter fell (an agent restarted): trapezoid of the power readings, (100+300)/2·10
    pytest.param((1, 0, 5000.0, 100.0), (2, 10_000, 200.0, 300.0), 2000.0, 0.0, id="counter-reset"),
    pytest.param((1, 0, 0.0, 100.0), (2, 600_000, 60_000.0, 100.0), 0.0, 600.0, id="gap"),
    # no energy counter at all (simulated clusters): trapezoid of power, (200+400)/2·5
    pytest.param((1, 0, 0.0, 200.0), (2, 5_000, 0.0, 400.0), 1500.0, 0.0, id="power-only"),
])
def test_summary_interval_record(prev, cur, it_joules, unknown_s):
    rec = summary_interval_record(_summary(*prev), _summary(*cur), price_per_mwh=40.0)
    assert rec.it_energy_joules == pytest.approx(it_joules)
    assert rec.unknown_seconds == pytest.approx(unknown_s)
    assert (rec.start_unix_ms, rec.end_unix_ms) == (prev[1], cur[1])


def test_summary_shares_energy_out_by_requests():
    """32-core cluster, 2000 J over 10 s of which 10 s × 100 W idle: A holds 8 cores, B 4 (tenant t2)."""
    prev = _summary(1, 0, 0.0, 200.0)
    prev.allocatable.milli_cpu = 32_000
    prev.idle_power_watts = 100.0
    prev.holdings.add(workload="a", tenant="t1", milli_cpu=8000)
    prev.holdings.add(workload="b", tenant="t2", milli_cpu=4000)
    cur = _summary(2, 10_000, 0.0, 200.0)
    cur.idle_power_watts = 100.0
    rec = summary_interval_record(prev, cur, price_per_mwh=40.0)
    shares = {s.workload: (s.tenant, s.it_energy_joules) for s in rec.shares}
    # idle 1000 J by requests over allocatable: a 1000·8/32 = 250, b 125; dynamic 1000 J by requests: a 2/3, b 1/3
    assert shares["a"] == ("t1", pytest.approx(250 + 1000 * 2 / 3))
    assert shares["b"] == ("t2", pytest.approx(125 + 1000 / 3))
    assert rec.it_energy_joules - sum(j for _, j in shares.values()) == pytest.approx(625.0)  # (idle) keeps the rest
    gap = summary_interval_record(prev, _summary(2, 600_000, 0.0, 200.0), price_per_mwh=40.0)
    assert list(gap.shares) == []  # an unknown interval shares out nothing
    assert list(summary_interval_record(_summary(1, 0, 0.0, 200.0), cur, price_per_mwh=40.0).shares) == []


def test_summary_accountant_restart_mid_stream(client, redis_url, key_prefix):
    """Summaries → ledger; a worker dies holding a batch, a new one takes over: energy = counter increase."""
    bus = open_bus(redis_url, key_prefix=key_prefix)
    ledger = RedisLedger(client, prefix=f"{key_prefix}meridian:")
    rng = np.random.default_rng(5)
    expected_j = 0.0
    for cluster, region in (("c1", "r1"), ("c2", "r2")):
        counter = float(rng.uniform(0, 1e6))
        payloads = []
        for seq in range(1, 31):
            if seq > 1:
                step = float(rng.uniform(1e3, 5e3))
                counter += step
                expected_j += step
            summary = _summary(seq, (T0_S + seq * 10) * 1000, counter, 300.0)
            summary.cluster, summary.region = cluster, region
            payloads.append(summary.SerializeToString())
        bus.publish_many(SUMMARY_STREAM, payloads)
    prices = lambda region, t_s: 100.0 if region == "r1" else 50.0  # noqa: E731
    first = SummaryAccountant(bus=bus, ledger=ledger, consumer="first", price_per_mwh=prices,
                              settings={"batch": 7})
    first.poll_once(block=False)
    first.poll_once(block=False)
    bus.read_group(SUMMARY_STREAM, first.group, "first", count=7)  # taken, then the process dies
    second = SummaryAccountant(bus=bus, ledger=ledger, consumer="second", price_per_mwh=prices,
                               settings={"batch": 16, "claim_idle_ms": 0})
    while second.poll_once(block=False).seen:
        pass
    assert bus.pending(SUMMARY_STREAM, second.group) == 0
    report = build_report(ledger)
    assert report.totals.energy_kwh == pytest.approx(expected_j / 3.6e6, rel=1e-9)
    # PUE 1.2 and 200 g/kWh on every summary: carbon = energy × 1.2 × 200
    assert report.totals.carbon_kg == pytest.approx(expected_j / 3.6e6 * 1.2 * 200 / 1000, rel=1e-9)


@pytest.mark.faults
@pytest.mark.parametrize("bad_tenant", ["evil|tenant", "", "x" * 300, "ansi\x1b[31m", "bidi\u202e"])
def test_one_bad_tenant_cannot_poison_a_clusters_summaries(client, redis_url, key_prefix, bad_tenant):
    """A holding whose tenant cannot key the ledger is charged to (invalid-name); every other tenant of
    the cluster keeps its accounting and no summary is dead-lettered."""
    bus = open_bus(redis_url, key_prefix=key_prefix)
    ledger = RedisLedger(client, prefix=f"{key_prefix}meridian:")
    payloads = []
    for seq in range(1, 6):
        s = _summary(seq, (T0_S + seq * 10) * 1000, 1000.0 * seq, 100.0)
        s.allocatable.milli_cpu = 16_000
        s.holdings.add(workload="good", tenant="t1", milli_cpu=8000)
        s.holdings.add(workload="bad", tenant=bad_tenant, milli_cpu=8000)
        payloads.append(s.SerializeToString())
    bus.publish_many(SUMMARY_STREAM, payloads)
    accountant = SummaryAccountant(bus=bus, ledger=ledger, consumer="a", price_per_mwh=lambda r, t: 50.0)
    while accountant.poll_once(block=False).seen:
        pass
    assert bus.length(SUMMARY_STREAM + ":dead") == 0
    by_tenant = build_report(ledger, ReportQuery(group_by="tenant")).groups
    assert set(by_tenant) == {"t1", "(invalid-name)"}
    # 4 intervals × 1000 J, all requested: half each
    assert by_tenant["t1"].energy_kwh == pytest.approx(2000.0 / 3.6e6, rel=1e-9)
    assert by_tenant["(invalid-name)"].energy_kwh == pytest.approx(2000.0 / 3.6e6, rel=1e-9)


@pytest.mark.faults
def test_energy_record_with_a_bad_share_name_is_applied_not_dead_lettered(client, redis_url, key_prefix):
    bus = open_bus(redis_url, key_prefix=key_prefix)
    ledger = RedisLedger(client, prefix=f"{key_prefix}meridian:")
    rec = _record(0)
    rec.shares.add(tenant="evil|tenant", workload="w2", it_energy_joules=500.0)
    publish_records(bus, [rec], stream=f"{key_prefix}energy")
    consumer = AccountingConsumer(bus=bus, ledger=ledger, consumer="c", stream=f"{key_prefix}energy")
    stats = consumer.poll_once(block=False)
    assert (stats.applied, stats.dead_lettered) == (1, 0)
    groups = build_report(ledger, ReportQuery(group_by="tenant")).groups
    assert groups["(invalid-name)"].energy_kwh == pytest.approx(500.0 / 3.6e6, rel=1e-9)
    assert groups["t"].energy_kwh == pytest.approx(1000.0 / 3.6e6, rel=1e-9)
