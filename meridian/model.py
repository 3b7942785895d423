"""Meridian's data model (pydantic v2): resources, nodes and pods with Kubernetes semantics.

Integer units everywhere so arithmetic is exact: CPU in millicores, memory in bytes, whole GPUs as
counts, a shared-GPU request in milli-GPU on one device. Quantities given as Kubernetes strings
(``"500m"``, ``"2Gi"``) are parsed with :mod:`meridian.quantity` and bad ones fail with a
:class:`~meridian.quantity.QuantityError` naming the field.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator

from meridian import quantity

MIB = 2**20
GIB = 2**30
MILLI_GPU_PER_DEVICE = 1000


def _milli(value: Any, info: ValidationInfo) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise quantity.QuantityError(info.field_name or "quantity", value, "must not be negative")
        return value
    return quantity.to_milli(value, field=info.field_name or "quantity")


def _whole(value: Any, info: ValidationInfo) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise quantity.QuantityError(info.field_name or "quantity", value, "must not be negative")
        return value
    return quantity.to_int(value, field=info.field_name or "quantity")


MilliQuantity = Annotated[int, BeforeValidator(_milli)]
WholeQuantity = Annotated[int, BeforeValidator(_whole)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Resources(Frozen):
    """A resource vector. ``gpu`` counts whole devices; ``gpu_milli`` is a share of one device."""

    milli_cpu: MilliQuantity = 0
    memory_bytes: WholeQuantity = 0
    gpu: WholeQuantity = 0
    gpu_milli: int = Field(0, ge=0, le=MILLI_GPU_PER_DEVICE)

    @model_validator(mode="after")
    def _gpu_shape(self) -> Resources:
        if self.gpu and self.gpu_milli:
            raise ValueError("a request is either whole GPUs (gpu) or a share of one (gpu_milli), not both")
        return self

    @property
    def gpu_milli_total(self) -> int:
        """GPU demand in milli-GPU: whole devices × 1000, or the share."""
        return self.gpu * MILLI_GPU_PER_DEVICE + self.gpu_milli


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Taint(Frozen):
    key: str
    value: str = ""
    effect: TaintEffect


class Toleration(Frozen):
    """``operator: Exists`` with an empty key tolerates every taint (Kubernetes semantics)."""

    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: TaintEffect | None = None

    def tolerates(self, taint: Taint) -> bool:
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return self.key == "" or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


class NodeSelectorRequirement(Frozen):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_shape(self) -> NodeSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt"):
            if len(self.values) != 1:
                raise ValueError(f"operator {self.operator} needs exactly one value")
            try:
                int(self.values[0])
            except ValueError:
                raise ValueError(f"operator {self.operator} needs an integer value, got {self.values[0]!r}") from None
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        try:
            label = int(labels[self.key])
        except ValueError:
            return False
        bound = int(self.values[0])
        return label > bound if self.operator == "Gt" else label < bound


class NodeSelectorTerm(Frozen):
    """Requirements within a term are ANDed; terms of an affinity are ORed (Kubernetes semantics)."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        return all(r.matches(labels) for r in self.match_expressions)


class QoSClass(StrEnum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"
    LATENCY_SENSITIVE = "LS"
    BE = "BE"


class GpuDevice(Frozen):
    index: int = Field(ge=0)
    free_milli: int = Field(MILLI_GPU_PER_DEVICE, ge=0, le=MILLI_GPU_PER_DEVICE)


class Node(Frozen):
    name: str = Field(min_length=1)
    capacity: Resources
    allocatable: Resources | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_model: str = ""
    gpus: tuple[GpuDevice, ...] = ()
    # Resources counted per node beyond CPU, memory and GPUs (Kubernetes' ``pods``, ``ephemeral-storage``,
    # extended resources), in integer units: bytes for storage, counts otherwise.
    scalar_allocatable: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Node:
        alloc = self.allocatable_resources
        if alloc.milli_cpu > self.capacity.milli_cpu or alloc.memory_bytes > self.capacity.memory_bytes:
            raise ValueError(f"node {self.name}: allocatable exceeds capacity")
        if self.gpus and len(self.gpus) != self.capacity.gpu:
            raise ValueError(f"node {self.name}: {len(self.gpus)} GPU devices listed but capacity says {self.capacity.gpu}")
        return self

    @property
    def allocatable_resources(self) -> Resources:
        return self.allocatable if self.allocatable is not None else self.capacity


class Pod(Frozen):
    name: str = Field(min_length=1)
    requests: Resources
    priority: int = 0
    qos: QoSClass = QoSClass.BURSTABLE
    labels: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    required_affinity: tuple[NodeSelectorTerm, ...] = ()
    allowed_gpu_models: tuple[str, ...] = ()
    tenant: str = "default"
    creation_time_s: float | None = None
    deletion_time_s: float | None = None
    # Requests of the node's scalar resources (see ``Node.scalar_allocatable``); a Kubernetes pod
    # always asks for one ``pods``.
    scalar_requests: dict[str, int] = Field(default_factory=dict)
