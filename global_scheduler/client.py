"""A small client of the global API for the CLI and the benchmarks.

Workload files are YAML (or JSON) with the ``WorkloadSpec`` fields; quantities stay strings and are
parsed by the server::

    name: train-recsys
    tenant: ads
    replicas: 4
    requests: {cpu: "8", memory: 32Gi, gpu: "1"}
    allowedRegions: [eu-north, eu-west]   # or allowed_regions
    originRegion: eu-west
    latencySloMs: 80
    deferrable: true
    deadline: "2026-12-01T06:00:00Z"       # or deadline_unix_s
    weights: {performance: 0.2, energy: 0.8}
    idempotencyKey: train-recsys-2026-11-30 # optional
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import yaml

from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

DEFAULT_TARGET = "127.0.0.1:50051"


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


class WorkloadFileError(ValueError):
    pass


def spec_from_mapping(doc: dict[str, Any]) -> tuple[api.WorkloadSpec, str]:
    """(spec, idempotency key) from a parsed workload file; unknown keys are an error naming them."""
    if not isinstance(doc, dict):
        raise WorkloadFileError("a workload file is a mapping of WorkloadSpec fields")
    doc = {_snake(k): v for k, v in doc.items()}
    key = str(doc.pop("idempotency_key", "") or "")
    if "deadline" in doc:
        value = doc.pop("deadline")
        try:
            doc["deadline_unix_s"] = (value if isinstance(value, datetime) else
                                      datetime.fromisoformat(str(value).replace("Z", "+00:00"))).timestamp()
        except ValueError:
            raise WorkloadFileError(f"deadline: not an ISO date-time: {value!r}") from None
    if "class" in doc:
        doc["workload_class"] = doc.pop("class")
    spec = api.WorkloadSpec()
    fields = {f.name for f in api.WorkloadSpec.DESCRIPTOR.fields}
    for name, value in doc.items():
        if name not in fields:
            raise WorkloadFileError(f"unknown field {name!r}; known: {', '.join(sorted(fields))}")
        if name == "requests":
            if not isinstance(value, dict):
                raise WorkloadFileError("requests: a mapping of cpu, memory, gpu, gpu_milli")
            for rk, rv in value.items():
                rk = _snake(rk)
                if rk not in ("cpu", "memory", "gpu", "gpu_milli"):
                    raise WorkloadFileError(f"requests.{rk}: unknown resource")
                setattr(spec.requests, rk, str(rv))
        elif name == "weights":
            for wk, wv in (value or {}).items():
                setattr(spec.weights, _snake(wk), float(wv))
        elif name == "allowed_regions":
            spec.allowed_regions.extend(str(v) for v in value)
        else:
            try:
                setattr(spec, name, value)
            except (TypeError, ValueError) as exc:
                raise WorkloadFileError(f"{name}: {exc}") from None
    return spec, key


def load_workload_file(path: Path) -> tuple[api.WorkloadSpec, str]:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise WorkloadFileError(f"{path}: not YAML: {exc}") from None
    return spec_from_mapping(doc)


class GlobalClient:
    def __init__(self, target: str | None = None, *, token: str | None = None, root_certificates: bytes | None = None,
                 timeout_s: float = 10.0) -> None:
        self.target = target or os.environ.get("MERIDIAN_API", DEFAULT_TARGET)
        token = token if token is not None else os.environ.get("MERIDIAN_TOKEN")
        if root_certificates is not None:
            self.channel = grpc.secure_channel(self.target, grpc.ssl_channel_credentials(root_certificates))
        else:
            self.channel = grpc.insecure_channel(self.target)
        self.stub = api_grpc.GlobalSchedulerStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> GlobalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, spec: api.WorkloadSpec, idempotency_key: str = "") -> api.Workload:
        return self.stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec, idempotency_key=idempotency_key),
                                        metadata=self.metadata, timeout=self.timeout_s)

    def get(self, wid: str) -> api.Workload:
        return self.stub.GetWorkload(api.GetWorkloadRequest(id=wid), metadata=self.metadata, timeout=self.timeout_s)

    def list(self, *, tenant: str = "", state: int = 0, cluster: str = "", page_size: int = 0) -> Iterator[api.Workload]:
        token = ""
        while True:
            page = self.stub.ListWorkloads(api.ListWorkloadsRequest(tenant=tenant, state=state, cluster=cluster,
                                                                    page_size=page_size, page_token=token),
                                           metadata=self.metadata, timeout=self.timeout_s)
            yield from page.workloads
            if not page.next_page_token:
                return
            token = page.next_page_token

    def watch(self, wid: str, timeout_s: float | None = None) -> Iterator[api.Workload]:
        return self.stub.WatchWorkload(api.WatchWorkloadRequest(id=wid), metadata=self.metadata, timeout=timeout_s)

    def cancel(self, wid: str) -> api.Workload:
        return self.stub.CancelWorkload(api.CancelWorkloadRequest(id=wid), metadata=self.metadata,
                                        timeout=self.timeout_s)

    def clusters(self) -> list[api.Cluster]:
        return list(self.stub.ListClusters(api.ListClustersRequest(), metadata=self.metadata,
                                           timeout=self.timeout_s).clusters)


def state_name(state: int) -> str:
    return api.WorkloadState.Name(state).removeprefix("WORKLOAD_STATE_")
