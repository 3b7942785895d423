"""Registry records as the ``protos/models.proto`` messages (bus events and the operators' gRPC API)."""

from __future__ import annotations

import json
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from meridian.model_registry.versions import ModelVersion, TransitionRecord
from protos import models_pb2


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def version_to_proto(version: ModelVersion) -> models_pb2.ModelVersion:
    window = version.data_window
    return models_pb2.ModelVersion(
        model=version.model, version_id=version.version_id, parent=version.parent or "",
        data_window=models_pb2.DataWindow(start=_timestamp(window.start), end=_timestamp(window.end),
                                          digest=window.digest),
        train_command=version.train_command, metrics=dict(version.metrics), created_at=_timestamp(version.created_at),
        state=version.state.value, artifact_sha256=version.artifact_digest,
        artifact_size_bytes=version.artifact_size_bytes,
        feature_layout_json=json.dumps(version.feature_layout, sort_keys=True), registered_by=version.registered_by)


def transition_to_proto(record: TransitionRecord) -> models_pb2.ModelTransition:
    return models_pb2.ModelTransition(
        model=record.model, version_id=record.version_id, from_state=record.from_state, to_state=record.to_state,
        who=record.who, why=record.why, evidence_json=json.dumps(record.evidence, sort_keys=True, default=str),
        at=_timestamp(record.at))
