import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnergyGroupBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENERGY_GROUP_BY_UNSPECIFIED: _ClassVar[EnergyGroupBy]
    ENERGY_GROUP_BY_REGION: _ClassVar[EnergyGroupBy]
    ENERGY_GROUP_BY_CLUSTER: _ClassVar[EnergyGroupBy]
    ENERGY_GROUP_BY_TENANT: _ClassVar[EnergyGroupBy]
    ENERGY_GROUP_BY_WORKLOAD: _ClassVar[EnergyGroupBy]
ENERGY_GROUP_BY_UNSPECIFIED: EnergyGroupBy
ENERGY_GROUP_BY_REGION: EnergyGroupBy
ENERGY_GROUP_BY_CLUSTER: EnergyGroupBy
ENERGY_GROUP_BY_TENANT: EnergyGroupBy
ENERGY_GROUP_BY_WORKLOAD: EnergyGroupBy

class EnergyShare(_message.Message):
    __slots__ = ("tenant", "workload", "it_energy_joules")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    IT_ENERGY_JOULES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workload: str
    it_energy_joules: float
    def __init__(self, tenant: _Optional[str] = ..., workload: _Optional[str] = ..., it_energy_joules: _Optional[float] = ...) -> None: ...

class EnergyRecord(_message.Message):
    __slots__ = ("record_id", "region", "cluster", "start_unix_ms", "end_unix_ms", "it_energy_joules", "unknown_seconds", "pue", "carbon_g_per_kwh", "price_per_mwh", "shares")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    IT_ENERGY_JOULES_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PUE_FIELD_NUMBER: _ClassVar[int]
    CARBON_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_MWH_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    region: str
    cluster: str
    start_unix_ms: int
    end_unix_ms: int
    it_energy_joules: float
    unknown_seconds: float
    pue: float
    carbon_g_per_kwh: float
    price_per_mwh: float
    shares: _containers.RepeatedCompositeFieldContainer[EnergyShare]
    def __init__(self, record_id: _Optional[str] = ..., region: _Optional[str] = ..., cluster: _Optional[str] = ..., start_unix_ms: _Optional[int] = ..., end_unix_ms: _Optional[int] = ..., it_energy_joules: _Optional[float] = ..., unknown_seconds: _Optional[float] = ..., pue: _Optional[float] = ..., carbon_g_per_kwh: _Optional[float] = ..., price_per_mwh: _Optional[float] = ..., shares: _Optional[_Iterable[_Union[EnergyShare, _Mapping]]] = ...) -> None: ...

class GetEnergyReportRequest(_message.Message):
    __slots__ = ("regions", "clusters", "since", "until", "group_by", "bucket_seconds", "counterfactual_policy")
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERFACTUAL_POLICY_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedScalarFieldContainer[str]
    clusters: _containers.RepeatedScalarFieldContainer[str]
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    group_by: EnergyGroupBy
    bucket_seconds: int
    counterfactual_policy: str
    def __init__(self, regions: _Optional[_Iterable[str]] = ..., clusters: _Optional[_Iterable[str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., group_by: _Optional[_Union[EnergyGroupBy, str]] = ..., bucket_seconds: _Optional[int] = ..., counterfactual_policy: _Optional[str] = ...) -> None: ...

class EnergyTotals(_message.Message):
    __slots__ = ("energy_kwh", "facility_energy_kwh", "carbon_kg", "cost", "unknown_seconds", "mean_power_watts", "carbon_intensity_g_per_kwh")
    ENERGY_KWH_FIELD_NUMBER: _ClassVar[int]
    FACILITY_ENERGY_KWH_FIELD_NUMBER: _ClassVar[int]
    CARBON_KG_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEAN_POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    CARBON_INTENSITY_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    energy_kwh: float
    facility_energy_kwh: float
    carbon_kg: float
    cost: float
    unknown_seconds: float
    mean_power_watts: float
    carbon_intensity_g_per_kwh: float
    def __init__(self, energy_kwh: _Optional[float] = ..., facility_energy_kwh: _Optional[float] = ..., carbon_kg: _Optional[float] = ..., cost: _Optional[float] = ..., unknown_seconds: _Optional[float] = ..., mean_power_watts: _Optional[float] = ..., carbon_intensity_g_per_kwh: _Optional[float] = ...) -> None: ...

class EnergyBucket(_message.Message):
    __slots__ = ("start", "end", "key", "totals")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    key: str
    totals: EnergyTotals
    def __init__(self, start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., key: _Optional[str] = ..., totals: _Optional[_Union[EnergyTotals, _Mapping]] = ...) -> None: ...

class WorkDone(_message.Message):
    __slots__ = ("replica_hours", "placed", "failures", "slo_violations")
    REPLICA_HOURS_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SLO_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    replica_hours: float
    placed: int
    failures: int
    slo_violations: int
    def __init__(self, replica_hours: _Optional[float] = ..., placed: _Optional[int] = ..., failures: _Optional[int] = ..., slo_violations: _Optional[int] = ...) -> None: ...

class Counterfactual(_message.Message):
    __slots__ = ("policy", "totals", "carbon_saved_kg", "carbon_saved_ratio", "work", "counterfactual_work")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    CARBON_SAVED_KG_FIELD_NUMBER: _ClassVar[int]
    CARBON_SAVED_RATIO_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    COUNTERFACTUAL_WORK_FIELD_NUMBER: _ClassVar[int]
    policy: str
    totals: EnergyTotals
    carbon_saved_kg: float
    carbon_saved_ratio: float
    work: WorkDone
    counterfactual_work: WorkDone
    def __init__(self, policy: _Optional[str] = ..., totals: _Optional[_Union[EnergyTotals, _Mapping]] = ..., carbon_saved_kg: _Optional[float] = ..., carbon_saved_ratio: _Optional[float] = ..., work: _Optional[_Union[WorkDone, _Mapping]] = ..., counterfactual_work: _Optional[_Union[WorkDone, _Mapping]] = ...) -> None: ...

class EnergyReport(_message.Message):
    __slots__ = ("source", "policy", "group_by", "currency", "since", "until", "bucket_seconds", "regions", "groups", "totals", "buckets", "counterfactual", "notes", "resolution_seconds")
    class RegionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: EnergyTotals
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[EnergyTotals, _Mapping]] = ...) -> None: ...
    class GroupsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: EnergyTotals
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[EnergyTotals, _Mapping]] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    COUNTERFACTUAL_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    source: str
    policy: str
    group_by: str
    currency: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    bucket_seconds: int
    regions: _containers.MessageMap[str, EnergyTotals]
    groups: _containers.MessageMap[str, EnergyTotals]
    totals: EnergyTotals
    buckets: _containers.RepeatedCompositeFieldContainer[EnergyBucket]
    counterfactual: Counterfactual
    notes: _containers.RepeatedScalarFieldContainer[str]
    resolution_seconds: float
    def __init__(self, source: _Optional[str] = ..., policy: _Optional[str] = ..., group_by: _Optional[str] = ..., currency: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., bucket_seconds: _Optional[int] = ..., regions: _Optional[_Mapping[str, EnergyTotals]] = ..., groups: _Optional[_Mapping[str, EnergyTotals]] = ..., totals: _Optional[_Union[EnergyTotals, _Mapping]] = ..., buckets: _Optional[_Iterable[_Union[EnergyBucket, _Mapping]]] = ..., counterfactual: _Optional[_Union[Counterfactual, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ..., resolution_seconds: _Optional[float] = ...) -> None: ...
