from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_KIND_UNSPECIFIED: _ClassVar[WorkloadKind]
    WORKLOAD_KIND_SERVICE: _ClassVar[WorkloadKind]
    WORKLOAD_KIND_BATCH: _ClassVar[WorkloadKind]

class PlacementPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_PHASE_UNSPECIFIED: _ClassVar[PlacementPhase]
    PLACEMENT_PHASE_SCHEDULED: _ClassVar[PlacementPhase]
    PLACEMENT_PHASE_RUNNING: _ClassVar[PlacementPhase]
    PLACEMENT_PHASE_FAILED: _ClassVar[PlacementPhase]
    PLACEMENT_PHASE_RELEASED: _ClassVar[PlacementPhase]
    PLACEMENT_PHASE_WAITING: _ClassVar[PlacementPhase]
    PLACEMENT_PHASE_SUCCEEDED: _ClassVar[PlacementPhase]
WORKLOAD_KIND_UNSPECIFIED: WorkloadKind
WORKLOAD_KIND_SERVICE: WorkloadKind
WORKLOAD_KIND_BATCH: WorkloadKind
PLACEMENT_PHASE_UNSPECIFIED: PlacementPhase
PLACEMENT_PHASE_SCHEDULED: PlacementPhase
PLACEMENT_PHASE_RUNNING: PlacementPhase
PLACEMENT_PHASE_FAILED: PlacementPhase
PLACEMENT_PHASE_RELEASED: PlacementPhase
PLACEMENT_PHASE_WAITING: PlacementPhase
PLACEMENT_PHASE_SUCCEEDED: PlacementPhase

class ReplicaRequests(_message.Message):
    __slots__ = ("milli_cpu", "memory_bytes", "gpu", "gpu_milli")
    MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    milli_cpu: int
    memory_bytes: int
    gpu: int
    gpu_milli: int
    def __init__(self, milli_cpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., gpu: _Optional[int] = ..., gpu_milli: _Optional[int] = ...) -> None: ...

class PlaceWorkload(_message.Message):
    __slots__ = ("workload_id", "attempt", "name", "tenant", "priority", "replicas", "requests", "dispatched_at_s", "kind", "image")
    WORKLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    workload_id: str
    attempt: int
    name: str
    tenant: str
    priority: int
    replicas: int
    requests: ReplicaRequests
    dispatched_at_s: float
    kind: WorkloadKind
    image: str
    def __init__(self, workload_id: _Optional[str] = ..., attempt: _Optional[int] = ..., name: _Optional[str] = ..., tenant: _Optional[str] = ..., priority: _Optional[int] = ..., replicas: _Optional[int] = ..., requests: _Optional[_Union[ReplicaRequests, _Mapping]] = ..., dispatched_at_s: _Optional[float] = ..., kind: _Optional[_Union[WorkloadKind, str]] = ..., image: _Optional[str] = ...) -> None: ...

class ReleaseWorkload(_message.Message):
    __slots__ = ("workload_id", "attempt", "reason")
    WORKLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    workload_id: str
    attempt: int
    reason: str
    def __init__(self, workload_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DispatchMessage(_message.Message):
    __slots__ = ("cluster", "place", "release")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PLACE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    place: PlaceWorkload
    release: ReleaseWorkload
    def __init__(self, cluster: _Optional[str] = ..., place: _Optional[_Union[PlaceWorkload, _Mapping]] = ..., release: _Optional[_Union[ReleaseWorkload, _Mapping]] = ...) -> None: ...

class PlacementEvent(_message.Message):
    __slots__ = ("workload_id", "attempt", "cluster", "phase", "reason", "nodes", "time_s", "ready_replicas")
    WORKLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    workload_id: str
    attempt: int
    cluster: str
    phase: PlacementPhase
    reason: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    time_s: float
    ready_replicas: int
    def __init__(self, workload_id: _Optional[str] = ..., attempt: _Optional[int] = ..., cluster: _Optional[str] = ..., phase: _Optional[_Union[PlacementPhase, str]] = ..., reason: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., time_s: _Optional[float] = ..., ready_replicas: _Optional[int] = ...) -> None: ...

class WorkloadMove(_message.Message):
    __slots__ = ("workload_id", "attempt", "from_cluster", "kind", "reason", "time_s")
    WORKLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FROM_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    workload_id: str
    attempt: int
    from_cluster: str
    kind: str
    reason: str
    time_s: float
    def __init__(self, workload_id: _Optional[str] = ..., attempt: _Optional[int] = ..., from_cluster: _Optional[str] = ..., kind: _Optional[str] = ..., reason: _Optional[str] = ..., time_s: _Optional[float] = ...) -> None: ...
