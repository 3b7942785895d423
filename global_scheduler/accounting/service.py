"""``EnergyReports`` gRPC service (``GetEnergyReport``), served beside ``GlobalScheduler``, and its client.

The global scheduler's server calls :func:`add_energy_service` with its live :class:`RedisLedger`
(any :class:`AccountingSource` works, a saved run too), so the server's interceptors (bearer token,
TLS) cover this service like the rest of the API. Bad arguments become ``INVALID_ARGUMENT`` whose
message starts with the request field at fault (``regions: unknown region …``).
"""

from __future__ import annotations

from datetime import UTC

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from global_scheduler.accounting.report import (
    AccountingSource,
    Counterfactual,
    EnergyBucket,
    EnergyReport,
    EnergyTotals,
    ReportArgumentError,
    ReportQuery,
    build_report,
    order_groups,
)
from global_scheduler.accounting.work import WorkDone
from protos import energy_pb2, energy_pb2_grpc

SERVICE_NAME = energy_pb2.DESCRIPTOR.services_by_name["EnergyReports"].full_name

_GROUP_BY_TO_PROTO = {
    "region": energy_pb2.ENERGY_GROUP_BY_REGION, "cluster": energy_pb2.ENERGY_GROUP_BY_CLUSTER,
    "tenant": energy_pb2.ENERGY_GROUP_BY_TENANT, "workload": energy_pb2.ENERGY_GROUP_BY_WORKLOAD,
}
_GROUP_BY_FROM_PROTO = {v: k for k, v in _GROUP_BY_TO_PROTO.items()} | {
    energy_pb2.ENERGY_GROUP_BY_UNSPECIFIED: "region"}
# CLI argument -> request field, for error messages that name what the caller actually sent.
_ARGUMENT_FIELDS = {"--region": "regions", "--cluster": "clusters", "--since": "since", "--until": "until",
                    "--bucket": "bucket_seconds", "--counterfactual": "counterfactual_policy", "--policy": "policy"}


def _ts(dt: object) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(dt)  # type: ignore[arg-type]
    return ts


def query_to_proto(q: ReportQuery) -> energy_pb2.GetEnergyReportRequest:
    req = energy_pb2.GetEnergyReportRequest(regions=q.regions, clusters=q.clusters,
                                            group_by=_GROUP_BY_TO_PROTO[q.group_by],
                                            bucket_seconds=q.bucket_seconds or 0,
                                            counterfactual_policy=q.counterfactual or "")
    if q.since is not None:
        req.since.CopyFrom(_ts(q.since))
    if q.until is not None:
        req.until.CopyFrom(_ts(q.until))
    return req


def query_from_proto(req: energy_pb2.GetEnergyReportRequest) -> ReportQuery:
    if req.group_by not in _GROUP_BY_FROM_PROTO:
        raise ReportArgumentError("group_by", f"unknown value {req.group_by}")
    if req.bucket_seconds < 0:
        raise ReportArgumentError("bucket_seconds", "must not be negative")
    return ReportQuery(
        regions=list(req.regions), clusters=list(req.clusters),
        since=req.since.ToDatetime(tzinfo=UTC) if req.HasField("since") else None,
        until=req.until.ToDatetime(tzinfo=UTC) if req.HasField("until") else None,
        group_by=_GROUP_BY_FROM_PROTO[req.group_by],  # type: ignore[arg-type]
        bucket_seconds=req.bucket_seconds or None, counterfactual=req.counterfactual_policy or None)


def _totals_to_proto(t: EnergyTotals) -> energy_pb2.EnergyTotals:
    msg = energy_pb2.EnergyTotals(energy_kwh=t.energy_kwh, facility_energy_kwh=t.facility_energy_kwh,
                                  carbon_kg=t.carbon_kg, cost=t.cost, unknown_seconds=t.unknown_seconds,
                                  mean_power_watts=t.mean_power_watts)
    if t.carbon_intensity_g_per_kwh is not None:
        msg.carbon_intensity_g_per_kwh = t.carbon_intensity_g_per_kwh
    return msg


def _totals_from_proto(m: energy_pb2.EnergyTotals) -> EnergyTotals:
    return EnergyTotals(energy_kwh=m.energy_kwh, facility_energy_kwh=m.facility_energy_kwh, carbon_kg=m.carbon_kg,
                        cost=m.cost, unknown_seconds=m.unknown_seconds, mean_power_watts=m.mean_power_watts,
                        carbon_intensity_g_per_kwh=m.carbon_intensity_g_per_kwh
                        if m.HasField("carbon_intensity_g_per_kwh") else None)


def _work_to_proto(w: WorkDone | None) -> energy_pb2.WorkDone | None:
    return None if w is None else energy_pb2.WorkDone(replica_hours=w.replica_hours, placed=w.placed,
                                                      failures=w.failures, slo_violations=w.slo_violations)


def _work_from_proto(m: energy_pb2.Counterfactual, name: str) -> WorkDone | None:
    if not m.HasField(name):
        return None
    w = getattr(m, name)
    return WorkDone(replica_hours=w.replica_hours, placed=w.placed, failures=w.failures,
                    slo_violations=w.slo_violations)


def report_to_proto(r: EnergyReport) -> energy_pb2.EnergyReport:
    msg = energy_pb2.EnergyReport(
        source=r.source, policy=r.policy, group_by=r.group_by, currency=r.currency, since=_ts(r.since),
        until=_ts(r.until), bucket_seconds=r.bucket_seconds or 0, totals=_totals_to_proto(r.totals),
        notes=r.notes, resolution_seconds=r.resolution_seconds,
        buckets=[energy_pb2.EnergyBucket(start=_ts(b.start), end=_ts(b.end), key=b.key,
                                         totals=_totals_to_proto(b.totals)) for b in r.buckets])
    for k, t in r.regions.items():
        msg.regions[k].CopyFrom(_totals_to_proto(t))
    for k, t in r.groups.items():
        msg.groups[k].CopyFrom(_totals_to_proto(t))
    if r.counterfactual is not None:
        cf = r.counterfactual
        msg.counterfactual.CopyFrom(energy_pb2.Counterfactual(
            policy=cf.policy, totals=_totals_to_proto(cf.totals), carbon_saved_kg=cf.carbon_saved_kg,
            carbon_saved_ratio=cf.carbon_saved_ratio, work=_work_to_proto(cf.work),
            counterfactual_work=_work_to_proto(cf.counterfactual_work)))
    return msg


def report_from_proto(m: energy_pb2.EnergyReport) -> EnergyReport:
    return EnergyReport(
        regions={k: _totals_from_proto(v) for k, v in sorted(m.regions.items())},
        totals=_totals_from_proto(m.totals), group_by=m.group_by,
        groups=order_groups(m.group_by, {k: _totals_from_proto(v) for k, v in m.groups.items()}), source=m.source,
        policy=m.policy, currency=m.currency, since=m.since.ToDatetime(tzinfo=UTC),
        until=m.until.ToDatetime(tzinfo=UTC), bucket_seconds=m.bucket_seconds or None,
        resolution_seconds=m.resolution_seconds,
        buckets=[EnergyBucket(start=b.start.ToDatetime(tzinfo=UTC), end=b.end.ToDatetime(tzinfo=UTC), key=b.key,
                              totals=_totals_from_proto(b.totals)) for b in m.buckets],
        counterfactual=Counterfactual(policy=m.counterfactual.policy,
                                      totals=_totals_from_proto(m.counterfactual.totals),
                                      carbon_saved_kg=m.counterfactual.carbon_saved_kg,
                                      carbon_saved_ratio=m.counterfactual.carbon_saved_ratio,
                                      work=_work_from_proto(m.counterfactual, "work"),
                                      counterfactual_work=_work_from_proto(m.counterfactual, "counterfactual_work"))
        if m.HasField("counterfactual") else None,
        notes=list(m.notes))


class EnergyReportsServicer(energy_pb2_grpc.EnergyReportsServicer):
    def __init__(self, source: AccountingSource) -> None:
        self.source = source

    def GetEnergyReport(self, request: energy_pb2.GetEnergyReportRequest,  # noqa: N802 (gRPC method name)
                        context: grpc.ServicerContext) -> energy_pb2.EnergyReport:
        try:
            report = build_report(self.source, query_from_proto(request))
        except ReportArgumentError as exc:
            field = _ARGUMENT_FIELDS.get(exc.argument, exc.argument)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {str(exc).split(': ', 1)[1]}")
        return report_to_proto(report)


def add_energy_service(server: grpc.Server, store: AccountingSource) -> EnergyReportsServicer:
    """Register ``EnergyReports`` on ``server`` (call before ``server.start()``); returns the servicer.

    The caller adds :data:`SERVICE_NAME` to its reflection and health service names.
    """
    servicer = EnergyReportsServicer(store)
    energy_pb2_grpc.add_EnergyReportsServicer_to_server(servicer, server)
    return servicer


def fetch_report(target: str, query: ReportQuery, *, token: str | None = None,
                 root_certificates: bytes | None = None, timeout_s: float = 30.0) -> EnergyReport:
    """Ask a live global scheduler for a report. Raises ``grpc.RpcError`` (``.code()``, ``.details()``)."""
    if root_certificates is not None:
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates))
    else:
        channel = grpc.insecure_channel(target)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with channel:
        stub = energy_pb2_grpc.EnergyReportsStub(channel)
        reply = stub.GetEnergyReport(query_to_proto(query), timeout=timeout_s, metadata=metadata)
    return report_from_proto(reply)
