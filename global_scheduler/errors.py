"""Rich gRPC errors: the standard ``google.rpc.Status`` details (AIP-193) beside our plain metadata.

The server packs ``BadRequest`` (the offending field), ``ErrorInfo`` (a stable machine-readable reason)
and ``ResourceInfo`` (the workload concerned) into ``grpc-status-details-bin``, so any gRPC client
(grpcurl, Go's ``status.FromError``, Python's ``rpc_status.from_call``) reads them without our code.
The older trailing keys ``meridian-field`` / ``meridian-workload-id`` are still sent for existing clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "meridian.v1"
FIELD_KEY = "meridian-field"
WORKLOAD_KEY = "meridian-workload-id"
WORKLOAD_TYPE = "meridian.v1.Workload"


@dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def _pack(message: object) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)  # type: ignore[arg-type]
    return out


def rich_status(code: grpc.StatusCode, message: str, *, field: str | None = None, reason: str | None = None,
                workload_id: str | None = None, metadata: Sequence[tuple[str, str]] = ()) -> grpc.Status:
    details = []
    if field is not None:
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=message)])))
    if reason is not None:
        details.append(_pack(error_details_pb2.ErrorInfo(
            reason=reason, domain=DOMAIN, metadata={"field": field} if field else {})))
    if workload_id is not None:
        details.append(_pack(error_details_pb2.ResourceInfo(resource_type=WORKLOAD_TYPE, resource_name=workload_id,
                                                            description=message)))
    packed = rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=details))
    extra: list[tuple[str, str]] = list(metadata)
    if field is not None:
        extra.append((FIELD_KEY, field))
    if workload_id is not None and code == grpc.StatusCode.ALREADY_EXISTS:
        extra.append((WORKLOAD_KEY, workload_id))
    return _Status(code, message, (*packed.trailing_metadata, *extra))


@dataclass(frozen=True)
class ErrorDetails:
    """What a client learns from a failed call."""

    code: str
    message: str
    fields: tuple[str, ...] = ()
    reason: str = ""
    workload_id: str = ""

    def describe(self) -> str:
        parts = [f"{self.code}: {self.message}"]
        if self.fields:
            parts.append(f"field: {', '.join(self.fields)}")
        if self.reason:
            parts.append(f"reason: {self.reason}")
        if self.workload_id:
            parts.append(f"workload: {self.workload_id}")
        return " | ".join(parts)


def error_details(exc: grpc.RpcError) -> ErrorDetails:
    """Unpack a failed call's ``google.rpc.Status`` details (none: code and message only)."""
    code = exc.code().name if exc.code() else "UNKNOWN"  # type: ignore[attr-defined]
    message = exc.details() or ""  # type: ignore[attr-defined]
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    fields: list[str] = []
    reason = workload = ""
    for any_msg in status.details if status is not None else []:
        if any_msg.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            any_msg.Unpack(br)
            fields.extend(v.field for v in br.field_violations)
        elif any_msg.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_msg.Unpack(info)
            reason = info.reason
        elif any_msg.Is(error_details_pb2.ResourceInfo.DESCRIPTOR):
            res = error_details_pb2.ResourceInfo()
            any_msg.Unpack(res)
            workload = res.resource_name
    return ErrorDetails(code, message, tuple(fields), reason, workload)
