"""The vectorised wire decoder agrees with upb (protobuf's reference parser) on arbitrary reports:
any values, unknown fields, concatenated (merged) messages, truncated bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meridian.bus import StreamEntry
from meridian.fleet import SimulatedFleet
from meridian.telemetry import (
    ARRAY_FIELDS,
    Rejected,
    TelemetryBatch,
    decode_reports,
    upb_batch,
    validate_batch,
)
from meridian.telemetry_wire import decode_wire
from protos import telemetry_pb2 as pb

INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL = st.integers(0, 2**40)
DOUBLE = st.floats(allow_nan=True, allow_infinity=True) | st.floats(0, 1e6)

report = st.builds(
    pb.NodeTelemetry,
    cluster=st.sampled_from(["east", "west", ""]), region=st.text(max_size=5), node=st.text(max_size=12),
    sequence=st.integers(0, 2**64 - 1), observed_unix_ms=INT64, sent_unix_ms=INT64,
    capacity_milli_cpu=SMALL | INT64, capacity_memory_bytes=SMALL, capacity_gpu=st.integers(0, 10),
    allocatable_milli_cpu=SMALL | INT64, allocatable_memory_bytes=SMALL | INT64, allocatable_gpu=st.integers(-2, 10),
    requested_milli_cpu=SMALL, requested_memory_bytes=INT64, used_milli_cpu=DOUBLE, used_memory_bytes=DOUBLE,
    power_watts=DOUBLE, power_source=st.integers(0, 3), energy_joules=DOUBLE, carbon_g_per_kwh=DOUBLE,
    carbon_source=st.integers(0, 4), pue=DOUBLE, gpu_model=st.text(max_size=6),
    gpu_free_milli=st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 1000), max_size=10),
    gpu_utilisation=st.lists(st.floats(0, 1, width=32), max_size=3), unschedulable=st.booleans(),
    boot_id=st.text(max_size=4), labels_included=st.booleans(),
    labels=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)


def _unknown_field(number: int, kind: int, payload: bytes) -> bytes:
    tag = (number << 3) | kind
    encoded = bytearray()
    while True:
        byte, tag = tag & 0x7F, tag >> 7
        encoded.append(byte | (0x80 if tag else 0))
        if not tag:
            break
    if kind == 0:
        return bytes(encoded) + b"\x96\x01"
    if kind == 1:
        return bytes(encoded) + payload[:8].ljust(8, b"\0")
    if kind == 5:
        return bytes(encoded) + payload[:4].ljust(4, b"\0")
    return bytes(encoded) + bytes([len(payload[:100])]) + payload[:100]


payload = st.one_of(
    report.map(lambda m: m.SerializeToString()),
    st.tuples(report, report).map(lambda ms: ms[0].SerializeToString() + ms[1].SerializeToString()),
    st.tuples(report, st.integers(34, 3000), st.sampled_from([0, 1, 2, 5]), st.binary(max_size=20)).map(
        lambda t: _unknown_field(t[1], t[2], t[3]) + t[0].SerializeToString()),
    st.tuples(report, st.floats(0, 1)).map(lambda t: t[0].SerializeToString()[: int(len(t[0].SerializeToString()) * t[1])]),
    st.binary(max_size=40),
)


def _rows_by_id(batch: TelemetryBatch) -> dict[str, int]:
    return {e.entry_id: i for i, e in enumerate(batch.entries)}


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(payload, min_size=1, max_size=12))
def test_decoder_agrees_with_upb(payloads: list[bytes]) -> None:
    entries = [StreamEntry(f"1-{i}", p) for i, p in enumerate(payloads)]
    reference_rejected: list[Rejected] = []
    reference, clusters = upb_batch(entries, reference_rejected)
    reference = validate_batch(reference, clusters, "east", reference_rejected)
    actual, rejected = decode_reports(entries, cluster="east", max_payload_bytes=1 << 20)
    assert sorted((r.entry.entry_id, r.reason_class) for r in rejected) == \
        sorted((r.entry.entry_id, r.reason_class) for r in reference_rejected)
    ref_rows, act_rows = _rows_by_id(reference), _rows_by_id(actual)
    assert ref_rows.keys() == act_rows.keys()
    for entry_id, i in ref_rows.items():
        j = act_rows[entry_id]
        assert actual.node[j] == reference.node[i] and actual.gpu_model[j] == reference.gpu_model[i]
        assert actual.labels.get(j) == reference.labels.get(i)
        for name in ARRAY_FIELDS:
            a, b = getattr(actual, name)[j], getattr(reference, name)[i]
            assert np.array_equal(a, b, equal_nan=bool(np.issubdtype(np.asarray(a).dtype, np.floating))), name


@pytest.mark.parametrize("nodes", [pytest.param(50, id="small"), pytest.param(2000, id="batch")])
def test_fleet_reports_take_the_fast_path(nodes: int) -> None:
    fleet = SimulatedFleet(cluster="east", region="r", n_nodes=nodes, start_sequence=0, labels_every=1000)
    fleet.reports(0.0)  # the first report carries labels (slow path); later ones do not
    payloads = fleet.reports(2.0)
    wire = decode_wire(payloads)
    assert not wire.slow.any()
    expected = [pb.NodeTelemetry.FromString(p) for p in payloads]
    assert wire.strings("node", np.arange(nodes)) == [m.node for m in expected]
    values, counts = wire.gpu_free(np.arange(nodes))
    assert counts.tolist() == [len(m.gpu_free_milli) for m in expected]
    assert values.tolist() == [v for m in expected for v in m.gpu_free_milli]


NODE = pb.NodeTelemetry(cluster="east", node="n", sequence=5).SerializeToString()


@pytest.mark.parametrize(
    ("payload", "slow", "reason_class", "gpu"),
    [
        # field 24, wire type 2, two bytes that never terminate a varint
        pytest.param(NODE + b"\xc2\x01\x02\x80\x80", True, "decode", None, id="packed-without-terminator"),
        # field 24 unpacked (wire type 0): valid protobuf, left to upb
        pytest.param(NODE + b"\xc0\x01\xe8\x07\xc0\x01\x00", True, None, [1000, 0], id="unpacked-repeated"),
        # field 24 packed in two chunks: protobuf concatenates them
        pytest.param(NODE + b"\xc2\x01\x02\xe8\x07\xc2\x01\x01\x05", True, None, [1000, 5], id="two-packed-chunks"),
        # an 11-byte varint for the sequence: malformed
        pytest.param(NODE + b"\x20" + b"\xff" * 10 + b"\x01", True, "decode", None, id="overlong-varint"),
        pytest.param(NODE + b"\xc2\x01\x03\xe8\x07\x07", False, None, [1000, 7], id="packed-fast"),
    ],
)
def test_edge_encodings(payload: bytes, slow: bool, reason_class: str | None, gpu: list[int] | None) -> None:
    assert bool(decode_wire([payload]).slow[0]) is slow
    batch, rejected = decode_reports([StreamEntry("1-0", payload)], cluster="east")
    if reason_class is not None:
        assert [r.reason_class for r in rejected] == [reason_class]
        return
    assert not rejected
    assert batch.gpu_free_milli[0, : len(gpu)].tolist() == gpu and batch.sequence[0] == 5
