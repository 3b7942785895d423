from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_STATE_UNSPECIFIED: _ClassVar[WorkloadState]
    WORKLOAD_STATE_PENDING: _ClassVar[WorkloadState]
    WORKLOAD_STATE_DISPATCHED: _ClassVar[WorkloadState]
    WORKLOAD_STATE_SCHEDULED: _ClassVar[WorkloadState]
    WORKLOAD_STATE_RUNNING: _ClassVar[WorkloadState]
    WORKLOAD_STATE_FAILED: _ClassVar[WorkloadState]
    WORKLOAD_STATE_CANCELLED: _ClassVar[WorkloadState]
    WORKLOAD_STATE_SUCCEEDED: _ClassVar[WorkloadState]
WORKLOAD_STATE_UNSPECIFIED: WorkloadState
WORKLOAD_STATE_PENDING: WorkloadState
WORKLOAD_STATE_DISPATCHED: WorkloadState
WORKLOAD_STATE_SCHEDULED: WorkloadState
WORKLOAD_STATE_RUNNING: WorkloadState
WORKLOAD_STATE_FAILED: WorkloadState
WORKLOAD_STATE_CANCELLED: WorkloadState
WORKLOAD_STATE_SUCCEEDED: WorkloadState

class ResourceQuantities(_message.Message):
    __slots__ = ("cpu", "memory", "gpu", "gpu_milli")
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    cpu: str
    memory: str
    gpu: str
    gpu_milli: str
    def __init__(self, cpu: _Optional[str] = ..., memory: _Optional[str] = ..., gpu: _Optional[str] = ..., gpu_milli: _Optional[str] = ...) -> None: ...

class ObjectiveWeights(_message.Message):
    __slots__ = ("performance", "cost", "energy", "fairness")
    PERFORMANCE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_FIELD_NUMBER: _ClassVar[int]
    performance: float
    cost: float
    energy: float
    fairness: float
    def __init__(self, performance: _Optional[float] = ..., cost: _Optional[float] = ..., energy: _Optional[float] = ..., fairness: _Optional[float] = ...) -> None: ...

class WorkloadSpec(_message.Message):
    __slots__ = ("name", "tenant", "priority", "replicas", "requests", "allowed_regions", "origin_region", "latency_slo_ms", "deferrable", "deadline_unix_s", "weights", "workload_class", "image")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_REGIONS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_REGION_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SLO_MS_FIELD_NUMBER: _ClassVar[int]
    DEFERRABLE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant: str
    priority: int
    replicas: int
    requests: ResourceQuantities
    allowed_regions: _containers.RepeatedScalarFieldContainer[str]
    origin_region: str
    latency_slo_ms: float
    deferrable: bool
    deadline_unix_s: float
    weights: ObjectiveWeights
    workload_class: str
    image: str
    def __init__(self, name: _Optional[str] = ..., tenant: _Optional[str] = ..., priority: _Optional[int] = ..., replicas: _Optional[int] = ..., requests: _Optional[_Union[ResourceQuantities, _Mapping]] = ..., allowed_regions: _Optional[_Iterable[str]] = ..., origin_region: _Optional[str] = ..., latency_slo_ms: _Optional[float] = ..., deferrable: _Optional[bool] = ..., deadline_unix_s: _Optional[float] = ..., weights: _Optional[_Union[ObjectiveWeights, _Mapping]] = ..., workload_class: _Optional[str] = ..., image: _Optional[str] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("id", "spec", "state", "cluster", "region", "attempt", "message", "created_unix_s", "updated_unix_s", "idempotency_key", "nodes", "not_before_unix_s", "ready_replicas")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: WorkloadSpec
    state: WorkloadState
    cluster: str
    region: str
    attempt: int
    message: str
    created_unix_s: float
    updated_unix_s: float
    idempotency_key: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    not_before_unix_s: float
    ready_replicas: int
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[WorkloadSpec, _Mapping]] = ..., state: _Optional[_Union[WorkloadState, str]] = ..., cluster: _Optional[str] = ..., region: _Optional[str] = ..., attempt: _Optional[int] = ..., message: _Optional[str] = ..., created_unix_s: _Optional[float] = ..., updated_unix_s: _Optional[float] = ..., idempotency_key: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., not_before_unix_s: _Optional[float] = ..., ready_replicas: _Optional[int] = ...) -> None: ...

class SubmitWorkloadRequest(_message.Message):
    __slots__ = ("spec", "idempotency_key")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    spec: WorkloadSpec
    idempotency_key: str
    def __init__(self, spec: _Optional[_Union[WorkloadSpec, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class GetWorkloadRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListWorkloadsRequest(_message.Message):
    __slots__ = ("tenant", "state", "cluster", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    state: WorkloadState
    cluster: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., state: _Optional[_Union[WorkloadState, str]] = ..., cluster: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkloadsResponse(_message.Message):
    __slots__ = ("workloads", "next_page_token")
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workloads: _containers.RepeatedCompositeFieldContainer[Workload]
    next_page_token: str
    def __init__(self, workloads: _Optional[_Iterable[_Union[Workload, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchWorkloadRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class CancelWorkloadRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("name", "region", "ready", "last_seen_unix_s", "allocatable_milli_cpu", "free_milli_cpu", "allocatable_memory_bytes", "free_memory_bytes", "gpus", "free_gpus", "nodes", "carbon_g_per_kwh", "price_per_mwh", "queued_workloads", "carbon_unknown")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    FREE_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CARBON_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_MWH_FIELD_NUMBER: _ClassVar[int]
    QUEUED_WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    CARBON_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    name: str
    region: str
    ready: bool
    last_seen_unix_s: float
    allocatable_milli_cpu: int
    free_milli_cpu: int
    allocatable_memory_bytes: int
    free_memory_bytes: int
    gpus: int
    free_gpus: int
    nodes: int
    carbon_g_per_kwh: float
    price_per_mwh: float
    queued_workloads: int
    carbon_unknown: bool
    def __init__(self, name: _Optional[str] = ..., region: _Optional[str] = ..., ready: _Optional[bool] = ..., last_seen_unix_s: _Optional[float] = ..., allocatable_milli_cpu: _Optional[int] = ..., free_milli_cpu: _Optional[int] = ..., allocatable_memory_bytes: _Optional[int] = ..., free_memory_bytes: _Optional[int] = ..., gpus: _Optional[int] = ..., free_gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., carbon_g_per_kwh: _Optional[float] = ..., price_per_mwh: _Optional[float] = ..., queued_workloads: _Optional[int] = ..., carbon_unknown: _Optional[bool] = ...) -> None: ...

class ListClustersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClustersResponse(_message.Message):
    __slots__ = ("clusters",)
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...
