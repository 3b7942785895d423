"""KEDA external scaler (``externalscaler.ExternalScaler``) backed by the predictive autoscaler.

KEDA creates an HPA whose external metric is ``metric_name`` with an ``AverageValue`` target of 1, and
polls ``GetMetrics``; we report the guarded desired replica count as the metric value, so the HPA's
``ceil(value / 1)`` lands exactly on our decision (KEDA's min/max replica counts still apply).
``IsActive`` is true while the decision is above zero (scale-from-zero); ``StreamIsActive`` pushes that
every ``stream_interval_s``. ``StreamMetricSpec`` is left unimplemented: KEDA then falls back to
``GetMetricSpec`` (documented behaviour), and our spec never changes anyway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc

from protos import externalscaler_pb2 as pb
from protos import externalscaler_pb2_grpc as pb_grpc
from regional_scheduler.autoscaling.settings import KedaSettings

log = logging.getLogger(__name__)

DesiredReplicas = Callable[[pb.ScaledObjectRef], int | None]


class PredictiveExternalScaler(pb_grpc.ExternalScalerServicer):
    def __init__(self, desired_replicas: DesiredReplicas, settings: KedaSettings | None = None,
                 stop: threading.Event | None = None) -> None:
        self.desired_replicas = desired_replicas
        self.settings = settings or KedaSettings()
        self.stop = stop or threading.Event()

    def _desired(self, ref: pb.ScaledObjectRef, context: grpc.ServicerContext) -> int:
        value = self.desired_replicas(ref)
        if value is None:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"no decision yet for {ref.namespace}/{ref.name}: the autoscaler has no samples")
        return int(value)  # type: ignore[arg-type]

    def IsActive(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> pb.IsActiveResponse:  # noqa: N802 - gRPC method name
        return pb.IsActiveResponse(result=self._desired(request, context) > 0)

    def StreamIsActive(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext  # noqa: N802 - gRPC method name
                       ) -> Iterator[pb.IsActiveResponse]:
        while context.is_active() and not self.stop.is_set():
            yield pb.IsActiveResponse(result=self._desired(request, context) > 0)
            self.stop.wait(self.settings.stream_interval_s)

    def GetMetricSpec(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext  # noqa: N802 - gRPC method name
                      ) -> pb.GetMetricSpecResponse:
        return pb.GetMetricSpecResponse(metricSpecs=[
            pb.MetricSpec(metricName=self.settings.metric_name, targetSize=1, targetSizeFloat=1.0)])

    def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.ServicerContext) -> pb.GetMetricsResponse:  # noqa: N802 - gRPC method name
        if request.metricName and request.metricName != self.settings.metric_name:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"unknown metric {request.metricName!r}; this scaler serves {self.settings.metric_name!r}")
        desired = self._desired(request.scaledObjectRef, context)
        return pb.GetMetricsResponse(metricValues=[
            pb.MetricValue(metricName=self.settings.metric_name, metricValue=desired,
                           metricValueFloat=float(desired))])


def serve(servicer: PredictiveExternalScaler, address: str) -> tuple[grpc.Server, int]:
    """Start a gRPC server with the scaler on ``address``; returns it and the bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_ExternalScalerServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the KEDA external scaler to {address}")
    server.start()
    log.info("KEDA external scaler listening on %s", address.rsplit(":", 1)[0] + f":{port}")
    return server, port
