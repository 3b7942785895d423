"""Regional state from telemetry: bulk decode and its rejections, idempotent vectorised application,
growth by new nodes, staleness on an injectable clock, and the consumer over both bus implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meridian.bus import (
    InProcessStreamBus,
    RedisStreamBus,
    StreamBus,
    StreamEntry,
    dead_letter_stream,
    telemetry_stream,
)
from meridian.cluster_state import ClusterState
from meridian.model import GIB, Node, Resources
from meridian.telemetry import decode_reports
from protos import telemetry_pb2 as pb
from regional_scheduler.telemetry_state import TelemetryConsumer, TelemetryConsumerSettings, TelemetryState

CLUSTER = "east"


def report(node: str, seq: int, *, cluster: str = CLUSTER, **fields: object) -> bytes:
    values: dict[str, object] = {
        "allocatable_milli_cpu": 8000, "allocatable_memory_bytes": 32 * GIB, "requested_milli_cpu": 1000,
        "requested_memory_bytes": 4 * GIB, "used_milli_cpu": 500.0, "used_memory_bytes": float(2 * GIB),
        "power_watts": 150.0, "energy_joules": 1000.0, "carbon_g_per_kwh": 200.0, "pue": 1.2,
        "observed_unix_ms": 1_000_000,
    }
    values.update(fields)
    return pb.NodeTelemetry(cluster=cluster, node=node, sequence=seq, **values).SerializeToString()


def entries(*payloads: bytes) -> list[StreamEntry]:
    return [StreamEntry(f"1-{i}", p) for i, p in enumerate(payloads)]


def batch_of(*payloads: bytes):
    batch, rejected = decode_reports(entries(*payloads), cluster=CLUSTER)
    assert not rejected
    return batch


# ---------------------------------------------------------------------------------------- decode
@pytest.mark.parametrize(
    ("payload", "reason_class"),
    [
        pytest.param(report("n1", 1, labels={"k": "v" * 3000}, labels_included=True), "oversized", id="oversized"),
        pytest.param(b"\xff\xff\xff\xff", "decode", id="not-protobuf"),
        pytest.param(b"", "invalid", id="empty-message"),
        pytest.param(report("", 1), "invalid", id="no-node-name"),
        pytest.param(report("n1", 1, cluster="west"), "foreign", id="other-cluster"),
        pytest.param(report("n1", 1, power_watts=math.nan), "invalid", id="nan-power"),
        pytest.param(report("n1", 1, used_milli_cpu=-5.0), "invalid", id="negative-usage"),
        pytest.param(report("n1", 1, allocatable_gpu=9, gpu_free_milli=[0] * 9), "invalid", id="too-many-gpus"),
    ],
)
def test_decode_rejects_with_a_reason(payload: bytes, reason_class: str) -> None:
    good = report("ok", 1)
    batch, rejected = decode_reports(entries(good, payload, good), cluster=CLUSTER, max_payload_bytes=2048)
    assert len(batch) == 2 and batch.node == ["ok", "ok"]
    assert [r.reason_class for r in rejected] == [reason_class]
    assert rejected[0].entry.payload == payload
    assert rejected[0].reason.startswith(reason_class)


def test_decode_columns() -> None:
    batch = batch_of(report("n1", 7, allocatable_gpu=2, gpu_free_milli=[1000, 250], gpu_model="T4",
                            unschedulable=True),
                     report("n2", 9, allocatable_milli_cpu=0, allocatable_memory_bytes=0, capacity_milli_cpu=4000,
                            capacity_memory_bytes=GIB))
    assert batch.sequence.tolist() == [7, 9]
    assert batch.gpu_free_milli[0, :3].tolist() == [1000, 250, 0]
    assert batch.gpu_reported.tolist() == [True, False]
    assert batch.alloc_milli_cpu.tolist() == [8000, 4000]  # no allocatable: capacity is allocatable
    assert batch.unschedulable.tolist() == [True, False]
    assert batch.observed_s.tolist() == [1000.0, 1000.0]


# ---------------------------------------------------------------------------------------- apply
@pytest.mark.parametrize(
    ("first", "second", "applied", "duplicates", "older", "final_seq"),
    [
        pytest.param([1], [2], 2, 0, 0, 2, id="newer-applies"),
        pytest.param([5], [5], 1, 1, 0, 5, id="redelivery-is-duplicate"),
        pytest.param([5], [3], 1, 0, 1, 5, id="older-is-ignored"),
        pytest.param([1, 2, 3], [], 3, 0, 0, 3, id="in-batch-newest-wins"),
        pytest.param([4, 4, 2], [], 2, 1, 0, 4, id="in-batch-duplicate-pair"),
        pytest.param([3], [1, 2, 4], 2, 0, 2, 4, id="mixed"),
    ],
)
def test_application_is_idempotent_by_node_and_sequence(first: list[int], second: list[int], applied: int,
                                                       duplicates: int, older: int, final_seq: int) -> None:
    ts = TelemetryState(cluster=CLUSTER, clock=lambda: 0.0)
    for seqs in (first, second):
        if seqs:
            ts.apply(batch_of(*(report("n1", s, used_milli_cpu=100.0 * s) for s in seqs)))
    assert (ts.applied_total, ts.duplicate_total, ts.stale_sequence_total) == (applied, duplicates, older)
    i = ts.state.index["n1"]
    assert ts.state.last_seq[i] == final_seq
    assert ts.state.used_milli_cpu[i] == 100.0 * final_seq  # the newest report's values


def test_new_nodes_grow_the_state_column_wise() -> None:
    known = Node(name="old", capacity=Resources(milli_cpu=2000, memory_bytes=GIB))
    ts = TelemetryState(cluster=CLUSTER, state=ClusterState.from_nodes([known]), clock=lambda: 0.0)
    applied = ts.apply(batch_of(
        report("gpu-1", 1, allocatable_gpu=4, gpu_free_milli=[1000, 500, 0, 1000], gpu_model="A100",
               labels_included=True, labels={"zone": "a"}, taints=[pb.Taint(key="gpu", effect="NoSchedule")]),
        report("cpu-1", 1, labels_included=True, labels={"zone": "a"}),
        report("cpu-2", 1, labels_included=True, labels={"zone": "a"}),
        report("gpu-1", 2, allocatable_gpu=4, gpu_free_milli=[0, 0, 0, 0], gpu_model="A100"),
    ))
    st = ts.state
    assert st.names[0] == "old" and sorted(st.names[1:]) == ["cpu-1", "cpu-2", "gpu-1"]
    assert len(applied) == 4
    g = st.index["gpu-1"]
    assert st.gpu_exists[g].tolist() == [True] * 4 + [False] * 4
    assert st.gpu_free_milli[g, :4].tolist() == [0, 0, 0, 0]  # the newer report's devices
    assert st.gpu_models[st.gpu_model_id[g]] == "A100"
    assert st.req_milli_cpu[g] == 1000 and st.alloc_memory_bytes[g] == 32 * GIB
    # cpu-1 and cpu-2 share one constraint group; gpu-1 (tainted) has its own
    c1, c2 = st.index["cpu-1"], st.index["cpu-2"]
    assert st.constraint_group[c1] == st.constraint_group[c2] != st.constraint_group[g]
    assert st.group_taints[st.constraint_group[g]][0].key == "gpu"
    assert np.isnan(st.used_milli_cpu[st.index["old"]])


def test_relabel_moves_the_node_to_its_new_group() -> None:
    ts = TelemetryState(cluster=CLUSTER, clock=lambda: 0.0)
    ts.apply(batch_of(report("a", 1, labels_included=True, labels={"zone": "x"}),
                      report("b", 1, labels_included=True, labels={"zone": "y"})))
    ts.apply(batch_of(report("a", 2, labels_included=True, labels={"zone": "y"})))
    st = ts.state
    assert st.constraint_group[st.index["a"]] == st.constraint_group[st.index["b"]]


@pytest.mark.parametrize(
    ("requests_from_reports", "expect_req"),
    [pytest.param(True, 1000, id="adopt-reported"), pytest.param(False, 0, id="keep-own-accounting")],
)
def test_requests_from_reports_switch(requests_from_reports: bool, expect_req: int) -> None:
    ts = TelemetryState(cluster=CLUSTER, requests_from_reports=requests_from_reports, clock=lambda: 0.0)
    ts.apply(batch_of(report("n", 1)))
    assert ts.state.req_milli_cpu[0] == expect_req


def test_node_version_bumps_only_on_scheduling_changes() -> None:
    ts = TelemetryState(cluster=CLUSTER, clock=lambda: 0.0)
    ts.apply(batch_of(report("n", 1)))
    v = int(ts.state.node_version[0])
    ts.apply(batch_of(report("n", 2, power_watts=999.0)))  # telemetry only
    assert ts.state.node_version[0] == v
    ts.apply(batch_of(report("n", 3, requested_milli_cpu=2000)))
    assert ts.state.node_version[0] == v + 1


# ---------------------------------------------------------------------------------------- staleness
def test_silent_node_becomes_unschedulable_after_the_timeout() -> None:
    clock = [100.0]
    ts = TelemetryState(cluster=CLUSTER, stale_after_s=10.0, clock=lambda: clock[0])
    ts.apply(batch_of(report("quiet", 1), report("chatty", 1), report("cordoned", 1, unschedulable=True)))
    q, c, k = (ts.state.index[n] for n in ("quiet", "chatty", "cordoned"))
    clock[0] = 109.0
    ts.apply(batch_of(report("chatty", 2)))
    assert ts.mark_stale() == 0
    assert ts.state.schedulable[[q, c, k]].tolist() == [True, True, False]
    clock[0] = 110.5  # quiet: 10.5 s silent > 10 s; chatty: 1.5 s
    assert ts.mark_stale() == 2  # quiet and cordoned are both silent
    assert ts.state.schedulable[[q, c, k]].tolist() == [False, True, False]
    ts.apply(batch_of(report("quiet", 2)))  # it speaks again
    assert ts.state.schedulable[q] and not ts.stale[q]


def test_preloaded_node_that_never_reports_goes_stale_after_the_grace_period() -> None:
    clock = [0.0]
    node = Node(name="ghost", capacity=Resources(milli_cpu=1000, memory_bytes=GIB))
    ts = TelemetryState(cluster=CLUSTER, state=ClusterState.from_nodes([node]), stale_after_s=5.0,
                        clock=lambda: clock[0])
    assert ts.mark_stale() == 0
    clock[0] = 6.0
    assert ts.mark_stale() == 1 and not ts.state.schedulable[0]


# ---------------------------------------------------------------------------------------- consumer
@pytest.fixture(params=["memory", "redis"])
def bus(request: pytest.FixtureRequest, redis_url: str, key_prefix: str) -> StreamBus:
    if request.param == "memory":
        return InProcessStreamBus(key_prefix=key_prefix)
    return RedisStreamBus(redis_url, key_prefix=key_prefix)


def test_consumer_applies_dead_letters_and_keeps_going(bus: StreamBus) -> None:
    settings = TelemetryConsumerSettings(cluster=CLUSTER, consumer="c1", bus={"block_ms": 0}, max_payload_bytes=1024)
    ts = TelemetryState(cluster=CLUSTER, clock=lambda: 0.0)
    consumer = TelemetryConsumer(bus=bus, state=ts, settings=settings)
    stream = telemetry_stream(CLUSTER)
    bus.publish_many(stream, [report("n1", 1), b"\x08\x96\x01\xff", report("n2", 1, labels_included=True,
                              labels={"big": "x" * 2000}), report("n2", 2), report("n1", 1)])
    while consumer.step():
        pass
    assert ts.applied_total == 2 and ts.duplicate_total == 1
    parked = [pb.DeadLetter.FromString(e.payload) for e in bus.read_range(dead_letter_stream(stream))]
    parked.sort(key=lambda d: d.reason)
    assert [d.reason.split(":")[0] for d in parked] == ["decode error", "oversized"]
    assert parked[1].payload_size_bytes > 1024 and parked[1].stream == stream
    assert bus.pending(stream, settings.group) == 0  # dead letters are acknowledged too
    bus.publish(stream, report("n1", 3))
    consumer.step()
    assert ts.state.last_seq[ts.state.index["n1"]] == 3
    bus.close()


def test_consumer_marks_a_silent_node_unschedulable_on_its_clock(bus: StreamBus) -> None:
    clock = [1000.0]
    settings = TelemetryConsumerSettings(cluster=CLUSTER, consumer="c1", bus={"block_ms": 0}, stale_after_s=10.0)
    ts = TelemetryState(cluster=CLUSTER, stale_after_s=settings.stale_after_s, clock=lambda: clock[0])
    consumer = TelemetryConsumer(bus=bus, state=ts, settings=settings, clock=lambda: clock[0])
    stream = telemetry_stream(CLUSTER)
    for second in range(0, 30, 2):  # "alive" reports every 2 s; "dying" stops after t = 4 s
        clock[0] = 1000.0 + second
        bus.publish_many(stream, [report("alive", second + 1)] + ([report("dying", second + 1)] if second <= 4 else []))
        consumer.step()
        dying = ts.state.index["dying"]
        # silent for more than 10 s (last report at t = 4 s) ⇔ unschedulable
        assert bool(ts.state.schedulable[dying]) == (second - 4 <= 10), second
        assert ts.state.schedulable[ts.state.index["alive"]]
    bus.close()


def test_duplicate_and_stale_sequence_outcomes_are_exported() -> None:
    from prometheus_client import REGISTRY

    def outcome(name: str) -> float:
        return REGISTRY.get_sample_value("meridian_telemetry_reports_total",
                                         {"cluster": "metrics-east", "outcome": name}) or 0.0

    before = {name: outcome(name) for name in ("applied", "duplicate", "stale_sequence")}
    ts = TelemetryState(cluster="metrics-east")
    first, _ = decode_reports(entries(report("a", 5, cluster="metrics-east")))
    ts.apply(first)
    again, _ = decode_reports(entries(report("a", 5, cluster="metrics-east"),  # the same report redelivered
                                      report("a", 3, cluster="metrics-east")))  # an older one, late
    ts.apply(again)
    assert outcome("applied") == before["applied"] + 1
    assert outcome("duplicate") == before["duplicate"] + 1
    assert outcome("stale_sequence") == before["stale_sequence"] + 1


def test_invented_node_names_cannot_grow_the_state_past_its_limit(bus: StreamBus) -> None:
    settings = TelemetryConsumerSettings(cluster=CLUSTER, consumer="c1", bus={"block_ms": 0}, max_nodes=3)
    ts = TelemetryState(cluster=CLUSTER, clock=lambda: 0.0, max_nodes=settings.max_nodes)
    consumer = TelemetryConsumer(bus=bus, state=ts, settings=settings)
    stream = telemetry_stream(CLUSTER)
    bus.publish_many(stream, [report(f"n{i}", 1) for i in range(5)])
    while consumer.step():
        pass
    assert ts.state.n_nodes == 3 and ts.state.names == ["n0", "n1", "n2"]
    parked = [pb.DeadLetter.FromString(e.payload) for e in bus.read_range(dead_letter_stream(stream))]
    assert len(parked) == 2 and all("too many nodes" in d.reason for d in parked)
    assert bus.pending(stream, settings.group) == 0
    bus.publish(stream, report("n0", 2))  # the nodes it holds keep reporting
    consumer.step()
    assert ts.state.last_seq[ts.state.index["n0"]] == 2
    bus.close()
