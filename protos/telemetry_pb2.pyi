from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PowerSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POWER_SOURCE_UNSPECIFIED: _ClassVar[PowerSource]
    POWER_SOURCE_RAPL: _ClassVar[PowerSource]
    POWER_SOURCE_MODEL: _ClassVar[PowerSource]
    POWER_SOURCE_GPU: _ClassVar[PowerSource]

class CarbonSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CARBON_SOURCE_UNSPECIFIED: _ClassVar[CarbonSource]
    CARBON_SOURCE_FEED_FILE: _ClassVar[CarbonSource]
    CARBON_SOURCE_REDIS_KEY: _ClassVar[CarbonSource]
    CARBON_SOURCE_STATIC: _ClassVar[CarbonSource]
    CARBON_SOURCE_SIMULATED: _ClassVar[CarbonSource]
    CARBON_SOURCE_NONE: _ClassVar[CarbonSource]
POWER_SOURCE_UNSPECIFIED: PowerSource
POWER_SOURCE_RAPL: PowerSource
POWER_SOURCE_MODEL: PowerSource
POWER_SOURCE_GPU: PowerSource
CARBON_SOURCE_UNSPECIFIED: CarbonSource
CARBON_SOURCE_FEED_FILE: CarbonSource
CARBON_SOURCE_REDIS_KEY: CarbonSource
CARBON_SOURCE_STATIC: CarbonSource
CARBON_SOURCE_SIMULATED: CarbonSource
CARBON_SOURCE_NONE: CarbonSource

class ResourceVector(_message.Message):
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

class Taint(_message.Message):
    __slots__ = ("key", "value", "effect")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    effect: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ...) -> None: ...

class NodeTelemetry(_message.Message):
    __slots__ = ("cluster", "region", "node", "sequence", "observed_unix_ms", "sent_unix_ms", "capacity_milli_cpu", "capacity_memory_bytes", "capacity_gpu", "allocatable_milli_cpu", "allocatable_memory_bytes", "allocatable_gpu", "requested_milli_cpu", "requested_memory_bytes", "used_milli_cpu", "used_memory_bytes", "power_watts", "power_source", "energy_joules", "carbon_g_per_kwh", "carbon_source", "pue", "gpu_model", "gpu_free_milli", "gpu_utilisation", "gpu_power_watts", "unschedulable", "boot_id", "labels_included", "labels", "taints", "pods_used_milli_cpu", "pods_used_memory_bytes")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_GPU_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_GPU_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    POWER_SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENERGY_JOULES_FIELD_NUMBER: _ClassVar[int]
    CARBON_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    CARBON_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PUE_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FREE_MILLI_FIELD_NUMBER: _ClassVar[int]
    GPU_UTILISATION_FIELD_NUMBER: _ClassVar[int]
    GPU_POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    UNSCHEDULABLE_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_INCLUDED_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TAINTS_FIELD_NUMBER: _ClassVar[int]
    PODS_USED_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    PODS_USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    region: str
    node: str
    sequence: int
    observed_unix_ms: int
    sent_unix_ms: int
    capacity_milli_cpu: int
    capacity_memory_bytes: int
    capacity_gpu: int
    allocatable_milli_cpu: int
    allocatable_memory_bytes: int
    allocatable_gpu: int
    requested_milli_cpu: int
    requested_memory_bytes: int
    used_milli_cpu: float
    used_memory_bytes: float
    power_watts: float
    power_source: PowerSource
    energy_joules: float
    carbon_g_per_kwh: float
    carbon_source: CarbonSource
    pue: float
    gpu_model: str
    gpu_free_milli: _containers.RepeatedScalarFieldContainer[int]
    gpu_utilisation: _containers.RepeatedScalarFieldContainer[float]
    gpu_power_watts: _containers.RepeatedScalarFieldContainer[float]
    unschedulable: bool
    boot_id: str
    labels_included: bool
    labels: _containers.ScalarMap[str, str]
    taints: _containers.RepeatedCompositeFieldContainer[Taint]
    pods_used_milli_cpu: float
    pods_used_memory_bytes: float
    def __init__(self, cluster: _Optional[str] = ..., region: _Optional[str] = ..., node: _Optional[str] = ..., sequence: _Optional[int] = ..., observed_unix_ms: _Optional[int] = ..., sent_unix_ms: _Optional[int] = ..., capacity_milli_cpu: _Optional[int] = ..., capacity_memory_bytes: _Optional[int] = ..., capacity_gpu: _Optional[int] = ..., allocatable_milli_cpu: _Optional[int] = ..., allocatable_memory_bytes: _Optional[int] = ..., allocatable_gpu: _Optional[int] = ..., requested_milli_cpu: _Optional[int] = ..., requested_memory_bytes: _Optional[int] = ..., used_milli_cpu: _Optional[float] = ..., used_memory_bytes: _Optional[float] = ..., power_watts: _Optional[float] = ..., power_source: _Optional[_Union[PowerSource, str]] = ..., energy_joules: _Optional[float] = ..., carbon_g_per_kwh: _Optional[float] = ..., carbon_source: _Optional[_Union[CarbonSource, str]] = ..., pue: _Optional[float] = ..., gpu_model: _Optional[str] = ..., gpu_free_milli: _Optional[_Iterable[int]] = ..., gpu_utilisation: _Optional[_Iterable[float]] = ..., gpu_power_watts: _Optional[_Iterable[float]] = ..., unschedulable: _Optional[bool] = ..., boot_id: _Optional[str] = ..., labels_included: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ..., taints: _Optional[_Iterable[_Union[Taint, _Mapping]]] = ..., pods_used_milli_cpu: _Optional[float] = ..., pods_used_memory_bytes: _Optional[float] = ...) -> None: ...

class ClusterSummary(_message.Message):
    __slots__ = ("cluster", "region", "sequence", "generated_unix_ms", "nodes_total", "nodes_schedulable", "nodes_stale", "allocatable", "requested", "free", "used", "gpu_free_milli", "gpu_devices_idle", "max_node_free_milli_cpu", "max_node_free_memory_bytes", "fragmentation_score", "power_watts", "energy_joules", "carbon_g_per_kwh", "carbon_g_per_s", "pue", "reports_applied", "idle_power_watts", "holdings", "holdings_complete", "carbon_unknown")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    GENERATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NODES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NODES_SCHEDULABLE_FIELD_NUMBER: _ClassVar[int]
    NODES_STALE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    GPU_FREE_MILLI_FIELD_NUMBER: _ClassVar[int]
    GPU_DEVICES_IDLE_FIELD_NUMBER: _ClassVar[int]
    MAX_NODE_FREE_MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    MAX_NODE_FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTATION_SCORE_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_JOULES_FIELD_NUMBER: _ClassVar[int]
    CARBON_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    CARBON_G_PER_S_FIELD_NUMBER: _ClassVar[int]
    PUE_FIELD_NUMBER: _ClassVar[int]
    REPORTS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    IDLE_POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    HOLDINGS_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    CARBON_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    region: str
    sequence: int
    generated_unix_ms: int
    nodes_total: int
    nodes_schedulable: int
    nodes_stale: int
    allocatable: ResourceVector
    requested: ResourceVector
    free: ResourceVector
    used: ResourceVector
    gpu_free_milli: int
    gpu_devices_idle: int
    max_node_free_milli_cpu: int
    max_node_free_memory_bytes: int
    fragmentation_score: float
    power_watts: float
    energy_joules: float
    carbon_g_per_kwh: float
    carbon_g_per_s: float
    pue: float
    reports_applied: int
    idle_power_watts: float
    holdings: _containers.RepeatedCompositeFieldContainer[WorkloadHolding]
    holdings_complete: bool
    carbon_unknown: bool
    def __init__(self, cluster: _Optional[str] = ..., region: _Optional[str] = ..., sequence: _Optional[int] = ..., generated_unix_ms: _Optional[int] = ..., nodes_total: _Optional[int] = ..., nodes_schedulable: _Optional[int] = ..., nodes_stale: _Optional[int] = ..., allocatable: _Optional[_Union[ResourceVector, _Mapping]] = ..., requested: _Optional[_Union[ResourceVector, _Mapping]] = ..., free: _Optional[_Union[ResourceVector, _Mapping]] = ..., used: _Optional[_Union[ResourceVector, _Mapping]] = ..., gpu_free_milli: _Optional[int] = ..., gpu_devices_idle: _Optional[int] = ..., max_node_free_milli_cpu: _Optional[int] = ..., max_node_free_memory_bytes: _Optional[int] = ..., fragmentation_score: _Optional[float] = ..., power_watts: _Optional[float] = ..., energy_joules: _Optional[float] = ..., carbon_g_per_kwh: _Optional[float] = ..., carbon_g_per_s: _Optional[float] = ..., pue: _Optional[float] = ..., reports_applied: _Optional[int] = ..., idle_power_watts: _Optional[float] = ..., holdings: _Optional[_Iterable[_Union[WorkloadHolding, _Mapping]]] = ..., holdings_complete: _Optional[bool] = ..., carbon_unknown: _Optional[bool] = ...) -> None: ...

class WorkloadHolding(_message.Message):
    __slots__ = ("workload", "tenant", "milli_cpu", "memory_bytes", "gpu_milli")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MILLI_CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    workload: str
    tenant: str
    milli_cpu: int
    memory_bytes: int
    gpu_milli: int
    def __init__(self, workload: _Optional[str] = ..., tenant: _Optional[str] = ..., milli_cpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., gpu_milli: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("stream", "entry_id", "group", "consumer", "reason", "payload", "payload_size_bytes", "dead_lettered_unix_ms")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    entry_id: str
    group: str
    consumer: str
    reason: str
    payload: bytes
    payload_size_bytes: int
    dead_lettered_unix_ms: int
    def __init__(self, stream: _Optional[str] = ..., entry_id: _Optional[str] = ..., group: _Optional[str] = ..., consumer: _Optional[str] = ..., reason: _Optional[str] = ..., payload: _Optional[bytes] = ..., payload_size_bytes: _Optional[int] = ..., dead_lettered_unix_ms: _Optional[int] = ...) -> None: ...
