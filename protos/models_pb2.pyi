import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataWindow(_message.Message):
    __slots__ = ("start", "end", "digest")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    digest: str
    def __init__(self, start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., digest: _Optional[str] = ...) -> None: ...

class ModelVersion(_message.Message):
    __slots__ = ("model", "version_id", "parent", "data_window", "train_command", "metrics", "created_at", "state", "artifact_sha256", "artifact_size_bytes", "feature_layout_json", "registered_by")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    DATA_WINDOW_FIELD_NUMBER: _ClassVar[int]
    TRAIN_COMMAND_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SHA256_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LAYOUT_JSON_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_BY_FIELD_NUMBER: _ClassVar[int]
    model: str
    version_id: str
    parent: str
    data_window: DataWindow
    train_command: str
    metrics: _containers.ScalarMap[str, float]
    created_at: _timestamp_pb2.Timestamp
    state: str
    artifact_sha256: str
    artifact_size_bytes: int
    feature_layout_json: str
    registered_by: str
    def __init__(self, model: _Optional[str] = ..., version_id: _Optional[str] = ..., parent: _Optional[str] = ..., data_window: _Optional[_Union[DataWindow, _Mapping]] = ..., train_command: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[str] = ..., artifact_sha256: _Optional[str] = ..., artifact_size_bytes: _Optional[int] = ..., feature_layout_json: _Optional[str] = ..., registered_by: _Optional[str] = ...) -> None: ...

class ModelTransition(_message.Message):
    __slots__ = ("model", "version_id", "from_state", "to_state", "who", "why", "evidence_json", "at")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    model: str
    version_id: str
    from_state: str
    to_state: str
    who: str
    why: str
    evidence_json: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, model: _Optional[str] = ..., version_id: _Optional[str] = ..., from_state: _Optional[str] = ..., to_state: _Optional[str] = ..., who: _Optional[str] = ..., why: _Optional[str] = ..., evidence_json: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[ModelVersion]
    def __init__(self, versions: _Optional[_Iterable[_Union[ModelVersion, _Mapping]]] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ("version_id",)
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    version_id: str
    def __init__(self, version_id: _Optional[str] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("version_id", "to_state", "who", "why", "evidence_json")
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    version_id: str
    to_state: str
    who: str
    why: str
    evidence_json: str
    def __init__(self, version_id: _Optional[str] = ..., to_state: _Optional[str] = ..., who: _Optional[str] = ..., why: _Optional[str] = ..., evidence_json: _Optional[str] = ...) -> None: ...

class PromoteResponse(_message.Message):
    __slots__ = ("version", "transitions")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    version: ModelVersion
    transitions: _containers.RepeatedCompositeFieldContainer[ModelTransition]
    def __init__(self, version: _Optional[_Union[ModelVersion, _Mapping]] = ..., transitions: _Optional[_Iterable[_Union[ModelTransition, _Mapping]]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("model", "who", "why", "evidence_json")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    model: str
    who: str
    why: str
    evidence_json: str
    def __init__(self, model: _Optional[str] = ..., who: _Optional[str] = ..., why: _Optional[str] = ..., evidence_json: _Optional[str] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("active", "retired", "transitions")
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    active: ModelVersion
    retired: ModelVersion
    transitions: _containers.RepeatedCompositeFieldContainer[ModelTransition]
    def __init__(self, active: _Optional[_Union[ModelVersion, _Mapping]] = ..., retired: _Optional[_Union[ModelVersion, _Mapping]] = ..., transitions: _Optional[_Iterable[_Union[ModelTransition, _Mapping]]] = ...) -> None: ...
