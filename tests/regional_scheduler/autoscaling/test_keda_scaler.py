"""The KEDA external scaler over a real gRPC channel on loopback, fed by the online autoscaler."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos import externalscaler_pb2 as pb
from protos import externalscaler_pb2_grpc as pb_grpc
from regional_scheduler.autoscaling.keda_scaler import PredictiveExternalScaler, serve
from regional_scheduler.autoscaling.online import OnlineAutoscaler, ServiceSample
from regional_scheduler.autoscaling.policies.forecast_policy import ForecastPolicy
from regional_scheduler.autoscaling.request_series import load_request_series
from regional_scheduler.autoscaling.settings import KedaSettings

METRIC = "meridian-desired-replicas"
REF = pb.ScaledObjectRef(name="web", namespace="shop", scalerMetadata={"scalerAddress": "meridian:9090"})


@pytest.fixture
def online(per_minute_csv: Path) -> OnlineAutoscaler:
    """An online autoscaler that has seen two days of the synthetic series."""
    autoscaler = OnlineAutoscaler(ForecastPolicy(1.0))
    series = load_request_series(per_minute_csv)
    replicas = 1
    for rate in series.requests_per_minute[: 2 * 1440 : 30]:
        replicas = autoscaler.update(ServiceSample(float(rate), replicas, 0, None, 100.0, 0.0))
    return autoscaler


@pytest.fixture
def channel(online: OnlineAutoscaler) -> Iterator[grpc.Channel]:
    stop = threading.Event()
    servicer = PredictiveExternalScaler(lambda _ref: online.current_desired(),
                                        KedaSettings(address="127.0.0.1:0", metric_name=METRIC,
                                                     stream_interval_s=0.01), stop)
    server, port = serve(servicer, "127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
        yield chan
    stop.set()
    server.stop(grace=None)


def test_get_metric_spec_reports_desired_replicas_with_average_value_one(channel: grpc.Channel) -> None:
    spec = pb_grpc.ExternalScalerStub(channel).GetMetricSpec(REF, timeout=10)
    assert [(m.metricName, m.targetSize, m.targetSizeFloat) for m in spec.metricSpecs] == [(METRIC, 1, 1.0)]


def test_get_metrics_returns_the_autoscaler_decision(channel: grpc.Channel, online: OnlineAutoscaler) -> None:
    response = pb_grpc.ExternalScalerStub(channel).GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=REF, metricName=METRIC), timeout=10)
    desired = online.current_desired()
    assert desired is not None and desired >= 1
    assert [(v.metricName, v.metricValue, v.metricValueFloat) for v in response.metricValues] == [
        (METRIC, desired, float(desired))]


def test_is_active_and_stream_is_active(channel: grpc.Channel) -> None:
    stub = pb_grpc.ExternalScalerStub(channel)
    assert stub.IsActive(REF, timeout=10).result is True
    stream = stub.StreamIsActive(REF, timeout=10)
    first = next(stream)
    assert first.result is True
    stream.cancel()


def test_unknown_metric_is_not_found(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.ExternalScalerStub(channel).GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=REF, metricName="queue-length"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_stream_metric_spec_is_left_to_keda_fallback(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        next(pb_grpc.ExternalScalerStub(channel).StreamMetricSpec(REF, timeout=10))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_no_decision_yet_is_unavailable() -> None:
    server, port = serve(PredictiveExternalScaler(lambda _ref: None), "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as chan, pytest.raises(grpc.RpcError) as err:
            pb_grpc.ExternalScalerStub(chan).IsActive(REF, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)


def test_proto_matches_keda_wire_contract() -> None:
    """Field names and numbers of KEDA's externalscaler.proto (the wire contract)."""
    fields = {m: {f.name: f.number for f in getattr(pb, m).DESCRIPTOR.fields} for m in (
        "ScaledObjectRef", "IsActiveResponse", "GetMetricSpecResponse", "MetricSpec", "GetMetricsRequest",
        "GetMetricsResponse", "MetricValue")}
    assert fields == {
        "ScaledObjectRef": {"name": 1, "namespace": 2, "scalerMetadata": 3},
        "IsActiveResponse": {"result": 1},
        "GetMetricSpecResponse": {"metricSpecs": 1},
        "MetricSpec": {"metricName": 1, "targetSize": 2, "targetSizeFloat": 3},
        "GetMetricsRequest": {"scaledObjectRef": 1, "metricName": 2},
        "GetMetricsResponse": {"metricValues": 1},
        "MetricValue": {"metricName": 1, "metricValue": 2, "metricValueFloat": 3},
    }
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert pb.DESCRIPTOR.package == "externalscaler"
    assert {m.name for m in service.methods} >= {"IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics"}
