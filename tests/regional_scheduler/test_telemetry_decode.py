"""``decode_reports`` on arbitrary and unusual payloads: every entry becomes a row or a rejection,
in stream order, and protobuf's encodings (merged messages, unpacked or split repeated fields,
malformed varints) decode as upb decodes them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meridian.bus import StreamEntry
from meridian.telemetry import decode_reports
from protos import telemetry_pb2 as pb

INT64 = st.integers(-(2**63), 2**63 - 1)
DOUBLE = st.floats(allow_nan=True, allow_infinity=True) | st.floats(0, 1e6)

report = st.builds(
    pb.NodeTelemetry,
    cluster=st.sampled_from(["east", "west", ""]), node=st.text(max_size=12), sequence=st.integers(0, 2**64 - 1),
    observed_unix_ms=INT64, allocatable_milli_cpu=INT64, allocatable_memory_bytes=INT64,
    allocatable_gpu=st.integers(-2, 10), used_milli_cpu=DOUBLE, power_watts=DOUBLE, energy_joules=DOUBLE,
    carbon_g_per_kwh=DOUBLE, pue=DOUBLE, gpu_free_milli=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=10),
    labels_included=st.booleans(), labels=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)
payload = st.one_of(
    report.map(lambda m: m.SerializeToString()),
    st.tuples(report, report).map(lambda ms: ms[0].SerializeToString() + ms[1].SerializeToString()),
    st.tuples(report, st.floats(0, 1)).map(lambda t: t[0].SerializeToString()[: int(len(t[0].SerializeToString()) * t[1])]),
    st.binary(max_size=40),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(payload, min_size=1, max_size=12))
def test_every_entry_is_a_row_or_a_rejection(payloads: list[bytes]) -> None:
    entries = [StreamEntry(f"1-{i}", p) for i, p in enumerate(payloads)]
    batch, rejected = decode_reports(entries, cluster="east", max_payload_bytes=1 << 20)
    kept = [e.entry_id for e in batch.entries]
    assert kept == sorted(kept, key=lambda entry_id: int(entry_id.split("-")[1]))  # stream order
    assert sorted(kept + [r.entry.entry_id for r in rejected]) == sorted(e.entry_id for e in entries)
    assert all(len(getattr(batch, name)) == len(batch) for name in ("sequence", "pue", "gpu_free_milli"))
    assert (batch.sequence >= 0).all()


NODE = pb.NodeTelemetry(cluster="east", node="n", sequence=5).SerializeToString()


@pytest.mark.parametrize(
    ("payload", "reason_class", "gpu"),
    [
        # field 24, wire type 2, two bytes that never terminate a varint
        pytest.param(NODE + b"\xc2\x01\x02\x80\x80", "decode", None, id="packed-without-terminator"),
        # field 24 unpacked (wire type 0): valid protobuf
        pytest.param(NODE + b"\xc0\x01\xe8\x07\xc0\x01\x00", None, [1000, 0], id="unpacked-repeated"),
        # field 24 packed in two chunks: protobuf concatenates them
        pytest.param(NODE + b"\xc2\x01\x02\xe8\x07\xc2\x01\x01\x05", None, [1000, 5], id="two-packed-chunks"),
        # an 11-byte varint for the sequence: malformed
        pytest.param(NODE + b"\x20" + b"\xff" * 10 + b"\x01", "decode", None, id="overlong-varint"),
        pytest.param(NODE + b"\xc2\x01\x03\xe8\x07\x07", None, [1000, 7], id="packed"),
    ],
)
def test_edge_encodings(payload: bytes, reason_class: str | None, gpu: list[int] | None) -> None:
    batch, rejected = decode_reports([StreamEntry("1-0", payload)], cluster="east")
    if reason_class is not None:
        assert [r.reason_class for r in rejected] == [reason_class]
        return
    assert not rejected
    assert batch.gpu_free_milli[0, : len(gpu)].tolist() == gpu and batch.sequence[0] == 5
