"""Workload files (``meridian submit FILE``), checked as the API checks a ``SubmitWorkload`` request.

A file is YAML (or JSON) with the ``WorkloadSpec`` fields, in snake_case or camelCase; quantities may
be strings or numbers and are parsed as the server parses them::

    name: train-recsys
    tenant: ads
    replicas: 4
    requests: {cpu: "8", memory: 32Gi, gpu: 1}
    allowedRegions: [eu-north, eu-west]   # or allowed_regions
    originRegion: eu-west
    latencySloMs: 80
    deferrable: true
    deadline: "2026-12-01T06:00:00Z"       # or deadline_unix_s
    weights: {performance: 0.2, energy: 0.8}
    class: batch                           # or workload_class
    image: registry.example.com/recsys/train:1.4  # optional; empty = the member cluster's default
    idempotencyKey: train-recsys-2026-11-30 # optional

:class:`WorkloadFile` is a strict pydantic model of that shape: no coercion (``allowed_regions:
eu-west`` is not read as the list of its letters, ``replicas: "3"`` is not an integer), every key
known (a typo is named, with the key it probably meant). Each field's content is then judged by the
API's own :func:`~global_scheduler.validation.validate_submit`, that field set on a spec valid in every
other respect, so a file's errors carry the API's field paths (``spec.allowed_regions[0]``) and words,
and every field's problem is reported at once, not only the first; the whole spec goes through
``validate_submit`` last for what spans fields (a latency SLO needs an origin region). Only what
depends on the server's state (known regions, cluster sizes) is left to the server.

:class:`WorkloadFileError` holds one line per problem: ``web.yaml: spec.replicas: must be an
integer, got 'three'``.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AliasChoices,
    AliasGenerator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from global_scheduler.validation import InvalidArgumentError, echo, validate_submit
from protos import global_api_pb2 as api


class WorkloadFileError(ValueError):
    """A workload file that cannot be submitted; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


# A spec the API accepts; a field is judged by setting it on a copy of this one.
_VALID = api.WorkloadSpec(name="probe", tenant="probe", replicas=1, requests=api.ResourceQuantities(cpu="1"),
                          origin_region="probe")


def _judged_by_api(field: str, fill: Callable[[api.WorkloadSpec], None]) -> None:
    """Raise the API's INVALID_ARGUMENT reason for ``field`` (``spec.…``) as set by ``fill``, if it has one."""
    spec = api.WorkloadSpec()
    spec.CopyFrom(_VALID)
    try:
        fill(spec)
        validate_submit(api.SubmitWorkloadRequest(spec=spec), now_s=time.time())
    except (TypeError, ValueError) as exc:  # InvalidArgumentError, or protobuf refusing the value (int32 range)
        named = getattr(exc, "field", field)
        if named == field or named.startswith((field + ".", field + "[")):
            reason = exc.reason if isinstance(exc, InvalidArgumentError) else "out of range of a 32-bit integer"
            raise PydanticCustomError("api_field", "{reason}", {"reason": reason, "api_field": named}) from None


def _quantity_text(value: Any) -> str:
    """Quantities as the API takes them, strings; YAML reads ``cpu: 2`` as a number."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise PydanticCustomError("quantity_type", "must be a quantity such as 500m, 2 or 4Gi, got {value}",
                              {"value": repr(value)})


def _deadline_unix_s(value: Any) -> Any:
    """``deadline``: an ISO date-time (YAML reads an unquoted one as a datetime) as unix seconds."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    if value is None:
        return None
    raise PydanticCustomError("date_time", "must be an ISO date-time such as 2026-12-01T06:00:00Z, got {value}",
                              {"value": echo(value) if isinstance(value, str) else repr(value)})


Quantity = Annotated[str, BeforeValidator(_quantity_text)]
_FILE_CONFIG = ConfigDict(strict=True, extra="forbid", alias_generator=AliasGenerator(
    validation_alias=lambda name: AliasChoices(name, to_camel(name))))


def _judged_in(message: str, value: Any, info: ValidationInfo) -> Any:
    """A field of ``spec.<message>`` (requests, weights), judged by the API's validation alone."""
    name = info.field_name
    assert name is not None
    _judged_by_api(f"spec.{message}.{name}", lambda spec: setattr(getattr(spec, message), name, value))
    return value


class RequestsFile(BaseModel):
    """Per-replica requests (``spec.requests``): Kubernetes quantities."""

    model_config = _FILE_CONFIG

    cpu: Quantity = ""
    memory: Quantity = ""
    gpu: Quantity = ""
    gpu_milli: Quantity = ""

    @field_validator("*")
    @classmethod
    def _api(cls, value: Any, info: ValidationInfo) -> Any:
        return _judged_in("requests", value, info)


class WeightsFile(BaseModel):
    """Objective weights (``spec.weights``); all zero: the workload class's defaults."""

    model_config = _FILE_CONFIG

    performance: float = 0.0
    cost: float = 0.0
    energy: float = 0.0
    fairness: float = 0.0

    @field_validator("*")
    @classmethod
    def _api(cls, value: Any, info: ValidationInfo) -> Any:
        return _judged_in("weights", value, info)


class WorkloadFile(BaseModel):
    """A workload file: the ``WorkloadSpec`` fields, ``deadline`` as an ISO date-time, ``class`` for
    ``workload_class``, and the optional ``idempotency_key``."""

    model_config = _FILE_CONFIG

    name: str
    tenant: str
    replicas: int
    requests: RequestsFile
    priority: int = 0
    allowed_regions: list[str] = []
    origin_region: str = ""
    latency_slo_ms: float = 0.0
    deferrable: bool = False
    deadline: Annotated[float | None, BeforeValidator(_deadline_unix_s)] = None
    deadline_unix_s: float = 0.0
    weights: WeightsFile = WeightsFile()
    workload_class: str = ""
    image: str = ""
    idempotency_key: str = ""

    @field_validator("name", "tenant", "replicas", "priority", "allowed_regions", "origin_region",
                     "latency_slo_ms", "workload_class", "image")
    @classmethod
    def _api(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        assert name is not None

        def fill(spec: api.WorkloadSpec) -> None:
            if name == "allowed_regions":
                spec.allowed_regions.extend(value)
            else:
                setattr(spec, name, value)

        _judged_by_api(f"spec.{name}", fill)
        return value

    def spec(self) -> api.WorkloadSpec:
        deadline_s = self.deadline if self.deadline is not None else self.deadline_unix_s
        return api.WorkloadSpec(
            name=self.name, tenant=self.tenant, priority=self.priority, replicas=self.replicas,
            requests=api.ResourceQuantities(**self.requests.model_dump()), allowed_regions=self.allowed_regions,
            origin_region=self.origin_region, latency_slo_ms=self.latency_slo_ms, deferrable=self.deferrable,
            deadline_unix_s=deadline_s, weights=api.ObjectiveWeights(**self.weights.model_dump()),
            workload_class=self.workload_class, image=self.image)


# Keys a file may use beside the fields' own names (and their camelCase).
_ALIASES = {"class": "workload_class"}


def _keys(model: type[BaseModel]) -> list[str]:
    """The keys ``model`` takes, both spellings (for "did you mean")."""
    names = [*model.model_fields, *(_ALIASES if model is WorkloadFile else ())]
    return sorted({*names, *(to_camel(n) for n in names)})


_KIND = {  # pydantic's error type → the API's words
    "missing": "required",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "dict_type": "must be a mapping",
}


def _path(loc: tuple[Any, ...]) -> tuple[str, type[BaseModel]]:
    """``spec.allowed_regions[0]`` from pydantic's location (file spellings made the API's), and the
    model the last key belongs to."""
    out = "spec"
    model: type[BaseModel] = WorkloadFile
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = next((n for n in model.model_fields if part in (n, to_camel(n))), part)
        out += f".{name}"
        annotation = model.model_fields[name].annotation if name in model.model_fields else None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    return ("idempotency_key" if out == "spec.idempotency_key" else out), model


def _unknown_key(error: Any) -> tuple[str, str | None, str | None]:
    """(path of an unknown key, the key it probably meant as the file would spell it, and that key's path),
    the last two None without a likely key."""
    loc = tuple(error["loc"])
    parent, model = _path(loc[:-1])
    guess = difflib.get_close_matches(str(loc[-1]), _keys(model), n=1, cutoff=0.6)
    if not guess:
        return f"{parent}.{loc[-1]}", None, None
    return f"{parent}.{loc[-1]}", guess[0], _path((*loc[:-1], _ALIASES.get(guess[0], guess[0])))[0]


def _describe(error: Any) -> str:
    """``spec.replicas: must be an integer, got 'three'`` for one pydantic error."""
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "extra_forbidden":
        path, guess, _ = _unknown_key(error)
        _, model = _path(tuple(error["loc"])[:-1])
        hint = f"; did you mean {guess!r}?" if guess else f" (known: {', '.join(model.model_fields)})"
        return f"{path}: unknown field{hint}"
    if kind == "api_field":
        return f"{ctx['api_field']}: {ctx['reason']}"
    path, _ = _path(tuple(error["loc"]))
    if kind in _KIND:
        text = _KIND[kind]
        if kind != "missing":
            value = error.get("input")
            text += f", got {echo(value) if isinstance(value, str) else repr(value)}"
            if kind == "list_type" and isinstance(value, str):
                text += f" (a list is written [{value}])"
        return f"{path}: {text}"
    return f"{path}: {error['msg'][:1].lower()}{error['msg'][1:]}"


def spec_from_mapping(doc: Any, source: str = "workload file") -> tuple[api.WorkloadSpec, str]:
    """(spec, idempotency key) from a parsed workload file; :class:`WorkloadFileError` lists every problem,
    each line starting with ``source``."""
    if not isinstance(doc, dict):
        got = "nothing" if doc is None else f"a {type(doc).__name__}"
        raise WorkloadFileError([f"{source}: a workload file is a mapping of WorkloadSpec fields (name, tenant, "
                                 f"replicas, requests, …), got {got}"])
    doc = {_ALIASES.get(k, k) if isinstance(k, str) else k: v for k, v in doc.items()}
    try:
        parsed = WorkloadFile.model_validate(doc)
    except ValidationError as exc:
        errors = exc.errors()
        # "spec.replica: unknown field; did you mean 'replicas'?" says all that "spec.replicas: required" would.
        meant = {_unknown_key(e)[2] for e in errors if e["type"] == "extra_forbidden"}
        raise WorkloadFileError([f"{source}: {_describe(e)}" for e in errors
                                 if not (e["type"] == "missing" and _path(tuple(e["loc"]))[0] in meant)]) from None
    spec = parsed.spec()
    try:  # what spans fields (a latency SLO without an origin, a deadline of a workload that cannot wait)
        validate_submit(api.SubmitWorkloadRequest(spec=spec, idempotency_key=parsed.idempotency_key),
                        now_s=time.time())
    except InvalidArgumentError as exc:
        raise WorkloadFileError([f"{source}: {exc}"]) from None
    return spec, parsed.idempotency_key


def load_workload_file(path: Path) -> tuple[api.WorkloadSpec, str]:
    """(spec, idempotency key) of the workload file at ``path``; :class:`WorkloadFileError` otherwise."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise WorkloadFileError([f"{path}: cannot read it: {exc.strerror or exc}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise WorkloadFileError([f"{path}: not YAML: {where}{problem}"]) from None
    return spec_from_mapping(doc, str(path))
