"""Clusters and regions from configuration: the federation file the live global scheduler reads.

The file (YAML, or JSON) lists the regions a deployment routes between and its member clusters;
docs/federation-config.md documents every field and ``examples/federation.yaml`` is a complete
example::

    regions:                       # a map name → region, or a list of regions with `name:`
      eu-north:
        carbon: {zone: NO}         # Electricity Maps-style zone id and/or a series file
        price_area: NO1            # ENTSO-E bidding area
        pue: 1.10
        location: {lat: 59.91, lon: 10.75}
    clusters:                      # a list of clusters with `name:`, or a map name → cluster
      - name: north-1
        region: eu-north
        kubeconfig: kubeconfigs/north-1.yaml   # relative to this file; or secret: {namespace, name, key}
        context: north-1                       # optional
    links:                         # optional round-trip overrides (ms) between two regions
      - between: [eu-north, eu-central]
        latency_ms: 14

:class:`FederationConfig` is the strict pydantic model of it: every key known (a typo is named, with the
key it probably meant), no coercion of numbers from strings, names as DNS-1123 labels, every cluster's
region one of the file's regions, a cluster reached (from the hub, by tools) through at most one of ``kubeconfig`` and ``secret``.
:func:`load_federation_config` reads a file and raises :class:`FederationConfigError` (a
:class:`~meridian.errors.UserError`: one line naming the file and every bad field) on any mistake.
:func:`api_client_for` gives a member cluster's Kubernetes ``ApiClient`` from its kubeconfig file or from
the kubeconfig in a Secret of the hub.

``registry.config_file`` (``MERIDIAN_GLOBAL_REGISTRY__CONFIG_FILE``) points the global scheduler at a
file; :meth:`global_scheduler.registry.ClusterRegistry.from_settings` reads it.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from meridian.errors import UserError, one_line
from meridian.regions import Location, Region

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

DOC = "docs/federation-config.md"
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


class FederationConfigError(UserError):
    """A federation file that cannot be used: the message names the file and each bad field."""


def _label(value: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL.fullmatch(value):
        raise ValueError(f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', starting and "
                         "ending with a letter or digit, at most 63 characters)")
    return value


def _subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
        raise ValueError(f"{value!r} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at "
                         "most 253 characters)")
    return value


def _secret_key(value: str) -> str:
    if len(value) > 253 or not _SECRET_KEY.fullmatch(value):
        raise ValueError(f"{value!r} is not a Secret data key (letters, digits, '-', '_' and '.')")
    return value


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


Label = Annotated[StrictStr, AfterValidator(_label)]
Subdomain = Annotated[StrictStr, AfterValidator(_subdomain)]
Text = Annotated[StrictStr, AfterValidator(_non_empty)]
Number = StrictFloat  # an int is taken as a float; a string is not


def _relative_to_file(value: Path | None, info: ValidationInfo) -> Path | None:
    """A relative path is taken relative to the directory of the file it is written in (as kubectl does
    for the paths inside a kubeconfig)."""
    base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
    if value is None or value.is_absolute() or base is None:
        return value
    return Path(base) / value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocationConfig(_Strict):
    """Where a region's data centres are, in degrees (WGS 84)."""

    lat: Number = Field(..., ge=-90, le=90, description="Latitude in degrees, -90 (south) to 90 (north).")
    lon: Number = Field(..., ge=-180, le=180, description="Longitude in degrees, -180 (west) to 180 (east).")


class CarbonConfig(_Strict):
    """Where a region's grid carbon intensity comes from: a zone, a series file, or both."""

    zone: Text | None = Field(None, description="Electricity Maps-style zone id of the region's grid (``DE``, "
                              "``NO``, ``US-CAL-CISO``): the zones of meridian.grid_data's series, and the "
                              "node agents' carbon.zone (they read the Redis key meridian:carbon:<zone>, kept "
                              "current by `meridian carbon-feeder --zone`).")
    file: Path | None = Field(None, description="A carbon series CSV (Electricity Maps or Let's Wait Awhile "
                              "export), as meridian.carbon_feed reads it; relative to this file.")
    year: StrictInt | None = Field(None, ge=1900, le=2200, description="The year of the zone's series a replay "
                                   "reads (the traces hold one or a few years per zone).")

    _file_path = field_validator("file")(_relative_to_file)

    @model_validator(mode="after")
    def _something(self) -> CarbonConfig:
        if self.zone is None and self.file is None:
            raise ValueError("give zone, file or both")
        return self


class RegionConfig(_Strict):
    """A region clusters run in."""

    name: Label = Field(..., description="The region's name (a DNS-1123 label): what clusters, workloads' "
                        "allowed_regions and origin_region name.")
    location: LocationConfig = Field(..., description="Where the region is: distances and round trips to other "
                                     "regions are computed from it (unless a link overrides them).")
    pue: Number | None = Field(None, ge=1.0, le=5.0, description="The sites' power usage effectiveness. Given, it "
                               "is the PUE routing uses for the region's clusters; unset, the clusters' summaries "
                               "say.")
    price_area: Text | None = Field(None, description="Electricity price area of the region (an ENTSO-E bidding "
                                    "area such as ``NO1``, ``DE-LU``, ``FR``; a proxy area outside ENTSO-E).")
    carbon: CarbonConfig | None = Field(None, description="The region's grid carbon source (zone and/or series "
                                        "file); unset: only what the clusters report.")

    def to_region(self) -> Region:
        """The core :class:`~meridian.regions.Region` of this entry."""
        carbon = self.carbon
        return Region(self.name, (carbon.zone or "") if carbon else "", (carbon.year or 0) if carbon else 0,
                      self.price_area or "", float(self.pue) if self.pue is not None else None,
                      float(self.location.lat), float(self.location.lon))


class SecretRef(_Strict):
    """A Secret in the hub cluster that holds a member's kubeconfig."""

    namespace: Label = Field(..., description="Namespace of the Secret in the hub.")
    name: Subdomain = Field(..., description="Name of the Secret.")
    key: Annotated[StrictStr, AfterValidator(_secret_key)] = Field(
        "kubeconfig", description="Key of the Secret's data holding the kubeconfig (default ``kubeconfig``).")


class ClusterConfig(_Strict):
    """A member cluster and, optionally, how to reach its API server from the hub: at most one of ``kubeconfig``
    and ``secret``. The global scheduler itself never connects to a member (members pull their work from their
    dispatch streams: :mod:`regional_scheduler.kube_dispatch`); the access is for tools that look into the
    members from the hub (``meridian bench federation``, ``meridian demo --kubernetes``)."""

    name: Label = Field(..., description="The cluster's name (a DNS-1123 label): the name its regional scheduler "
                        "reports under (its summaries' cluster) and its stream names use.")
    region: Label = Field(..., description="The region the cluster is in: one of this file's regions.")
    kubeconfig: Path | None = Field(None, description="A kubeconfig file for the cluster's API server; relative to "
                                    "this file.")
    secret: SecretRef | None = Field(None, description="A Secret in the hub (namespace, name, key) whose data holds "
                                     "a kubeconfig for the cluster's API server.")
    context: Text | None = Field(None, description="The kubeconfig context to use (default: its current-context); "
                                 "for a kubeconfig file or one from a Secret.")

    _kubeconfig_path = field_validator("kubeconfig")(_relative_to_file)

    @model_validator(mode="after")
    def _one_way_in(self) -> ClusterConfig:
        if self.kubeconfig is not None and self.secret is not None:
            raise ValueError("give at most one of kubeconfig (a file) and secret (a Secret in the hub), got both")
        return self


class LinkConfig(_Strict):
    """A measured round trip between two regions, used instead of the one computed from their locations."""

    between: tuple[Label, Label] = Field(..., description="The two regions, e.g. ``[eu-north, eu-central]``; "
                                         "the link is symmetric.")
    latency_ms: Number = Field(..., gt=0, le=10_000, description="Round-trip time between the two regions (ms).")

    @model_validator(mode="after")
    def _two_regions(self) -> LinkConfig:
        if self.between[0] == self.between[1]:
            raise ValueError(f"a link joins two different regions, got {self.between[0]!r} twice")
        return self


def _named_items(kind: str) -> Any:
    """A before-validator taking a list of ``{name: …}`` items or a map ``name → fields`` (the name is the key;
    an item may repeat it but not contradict it) as a list."""

    def to_list(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        out = []
        for key, item in value.items():
            if isinstance(item, Mapping):
                if "name" in item and item["name"] != key:
                    raise ValueError(f"{kind} {key!r} says name: {item['name']!r}; a map's key is the name")
                item = {"name": key, **item}
            out.append(item)
        return out

    return field_validator(kind, mode="before")(lambda cls, value: to_list(value))


class FederationConfig(_Strict):
    """The federation: its regions, member clusters and optional link overrides."""

    regions: list[RegionConfig] = Field(..., min_length=1, description="The regions this deployment routes "
                                        "between: a map from name to region or a list of regions with name.")
    clusters: list[ClusterConfig] = Field(default_factory=list, description="The member clusters: a list of "
                                          "clusters with name, or a map from name to cluster. Only these "
                                          "clusters' summaries are used.")
    links: list[LinkConfig] = Field(default_factory=list, description="Round-trip overrides between pairs of "
                                    "regions; every other pair's is computed from the locations.")
    _source: str | None = PrivateAttr(None)

    _regions_as_list = _named_items("regions")
    _clusters_as_list = _named_items("clusters")

    @model_validator(mode="after")
    def _consistent(self) -> FederationConfig:
        problems: list[str] = []
        names = [r.name for r in self.regions]
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"regions: {name!r} is listed {names.count(name)} times")
        known = set(names)
        cluster_names = [c.name for c in self.clusters]
        for name in sorted({n for n in cluster_names if cluster_names.count(n) > 1}):
            problems.append(f"clusters: {name!r} is listed {cluster_names.count(name)} times")
        for c in self.clusters:
            if c.region not in known:
                problems.append(f"clusters[{c.name}].region: {c.region!r} is not one of the regions "
                                f"({', '.join(names)})")
        seen: set[frozenset[str]] = set()
        for link in self.links:
            a, b = link.between
            for end in (a, b):
                if end not in known:
                    problems.append(f"links[{a}, {b}].between: {end!r} is not one of the regions ({', '.join(names)})")
            pair = frozenset((a, b))
            if pair in seen:
                problems.append(f"links[{a}, {b}]: this pair of regions is given twice")
            seen.add(pair)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ------------------------------------------------------------------ views
    @property
    def source(self) -> str | None:
        """The file this was read from (set by the loader), or None."""
        return self._source

    @property
    def region_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.clusters)

    def region(self, name: str) -> RegionConfig | None:
        return next((r for r in self.regions if r.name == name), None)

    def cluster(self, name: str) -> ClusterConfig | None:
        return next((c for c in self.clusters if c.name == name), None)

    def cluster_regions(self) -> dict[str, str]:
        """Cluster name → its region."""
        return {c.name: c.region for c in self.clusters}

    def core_regions(self) -> dict[str, Region]:
        """Region name → the core :class:`~meridian.regions.Region`."""
        return {r.name: r.to_region() for r in self.regions}

    def locations(self) -> dict[str, Location]:
        return {r.name: Location(float(r.location.lat), float(r.location.lon)) for r in self.regions}

    def link_overrides(self) -> dict[frozenset[str], float]:
        """{region a, region b} → round trip (ms) for each link given."""
        return {frozenset(link.between): float(link.latency_ms) for link in self.links}


# --------------------------------------------------------------------------------------------- loading
class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one map (plain YAML keeps the last silently) and reads
    only ``true``/``false`` as booleans (YAML 1.2), so Norway's zone ``NO`` stays the string "NO"."""


_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                       list("tTfF"))


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                    key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose fields the error at ``loc`` (names and list indexes) is about."""
    model: Any = FederationConfig
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        annotation = fields[part].annotation
        model = next((a for a in _type_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model if isinstance(model, type) else None


def _type_args(annotation: Any) -> Iterator[Any]:
    yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _type_args(arg)


def _where(raw: Any, loc: tuple[Any, ...]) -> str:
    """``loc`` as a path a reader finds in the file: list items by their name where they have one
    (``clusters[north-1].region``), map-form regions and clusters by their key."""
    out = ""
    node = raw
    for part in loc:
        if isinstance(part, int):
            label: Any = part
            item: Any = None
            if isinstance(node, Mapping):  # a map-form list (regions:/clusters: given as a map)
                keys = list(node)
                if part < len(keys):
                    label, item = keys[part], node[keys[part]]
            elif isinstance(node, list) and part < len(node):
                item = node[part]
                if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                    label = item["name"]
                elif isinstance(item, Mapping) and isinstance(item.get("between"), list):
                    label = ", ".join(map(str, item["between"]))
            out += f"[{label}]"
            node = item
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, Mapping) else None
    return out


def _describe(raw: Any, error: Any) -> str:
    loc = tuple(p for p in error.get("loc", ()) if not (isinstance(p, str) and p.startswith("function-")))
    kind = error.get("type", "")
    where = _where(raw, loc) or "(top level)"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        fields = list(model.model_fields) if model else []
        guess = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.6)
        known = f"did you mean {guess[0]!r}?" if guess else f"known: {', '.join(fields)}"
        return f"{where}: unknown field ({known})"
    if kind == "missing":
        return f"{where}: required"
    msg = one_line(error.get("msg", ""))
    msg = msg.removeprefix("Value error, ")
    if kind in {"value_error", "assertion_error"} and not loc:
        return msg
    return f"{where}: {msg}" + (f", got {error['input']!r}" if kind.endswith(("_type", "_parsing")) and
                                 "input" in error and not isinstance(error["input"], Mapping | list) else "")


def parse_federation_config(raw: Any, *, source: str = "<data>",
                            base_dir: Path | None = None) -> FederationConfig:
    """A :class:`FederationConfig` from already-parsed data (a mapping); ``source`` names it in errors and
    relative paths are taken from ``base_dir``."""
    if not isinstance(raw, Mapping):
        raise FederationConfigError(f"federation config {source}: the file must be a mapping with regions: and clusters:, got "
                                    f"{type(raw).__name__}", hint=f"see {DOC}")
    try:
        cfg = FederationConfig.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        problems = list(dict.fromkeys(_describe(raw, e) for e in exc.errors()))
        raise FederationConfigError(f"federation config {source}: " + "; ".join(problems), hint=f"fix the file (see {DOC})") from None
    cfg._source = source
    return cfg


def load_federation_config(path: str | Path) -> FederationConfig:
    """Read and check a federation file (YAML or JSON). Raises :class:`FederationConfigError`, one line naming
    the file and every bad field, for a missing or unreadable file, bad YAML, or a file that breaks the model."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FederationConfigError(f"federation config {path}: cannot read it: {one_line(exc.strerror or exc)}",
                                    hint="check registry.config_file (MERIDIAN_GLOBAL_REGISTRY__CONFIG_FILE)") from None
    except UnicodeDecodeError:
        raise FederationConfigError(f"federation config {path}: not UTF-8 text", hint=f"see {DOC}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FederationConfigError(f"federation config {path}: not valid YAML{at}: {one_line(problem)}",
                                    hint=f"see {DOC}") from None
    return parse_federation_config(raw, source=str(path), base_dir=path.parent)


# ------------------------------------------------------------------------------------- API clients
def kubeconfig_from_secret(hub: ApiClient, ref: SecretRef, *, cluster: str = "") -> dict[str, Any]:
    """The kubeconfig (as a dict) in the hub Secret ``ref``, read through the hub's ``ApiClient``."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    what = f"cluster {cluster}: " if cluster else ""
    where = f"Secret {ref.namespace}/{ref.name}"
    try:
        secret = CoreV1Api(hub).read_namespaced_secret(ref.name, ref.namespace)
    except ApiException as exc:
        raise FederationConfigError(f"{what}cannot read the {where} in the hub: {exc.status} {one_line(exc.reason)}",
                                    hint="create it, or grant the global scheduler get on that Secret") from None
    data = secret.data or {}
    if ref.key not in data:
        raise FederationConfigError(f"{what}the {where} has no key {ref.key!r} (keys: {', '.join(sorted(data))})",
                                    hint="set secret.key to the key holding the kubeconfig")
    try:
        text = base64.b64decode(data[ref.key], validate=True).decode("utf-8")
        kubeconfig = yaml.safe_load(text)
    except (binascii.Error, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise FederationConfigError(f"{what}the {where} key {ref.key!r} is not a kubeconfig: {one_line(exc)}",
                                    hint="store a kubeconfig YAML there") from None
    if not isinstance(kubeconfig, dict):
        raise FederationConfigError(f"{what}the {where} key {ref.key!r} is not a kubeconfig (not a mapping)",
                                    hint="store a kubeconfig YAML there")
    return kubeconfig


def api_client_for(cluster: ClusterConfig, *, hub: ApiClient | None = None) -> ApiClient:
    """A Kubernetes ``ApiClient`` for a member cluster's API server, from its kubeconfig file or from the
    kubeconfig in its hub Secret (read through ``hub``, the hub's ``ApiClient``). Building it contacts no
    server. Raises :class:`FederationConfigError` naming the cluster when the kubeconfig cannot be used."""
    from kubernetes import config as kube_config
    from kubernetes.config.config_exception import ConfigException

    try:
        if cluster.kubeconfig is not None:
            if not cluster.kubeconfig.is_file():
                raise FederationConfigError(f"cluster {cluster.name}: kubeconfig {cluster.kubeconfig} does not exist",
                                            hint="fix clusters[].kubeconfig in the federation config")
            return kube_config.new_client_from_config(config_file=str(cluster.kubeconfig), context=cluster.context,
                                                      persist_config=False)
        if cluster.secret is None:
            raise FederationConfigError(f"cluster {cluster.name}: the federation config gives no way to reach its "
                                        "API server", hint="add clusters[].kubeconfig or clusters[].secret")
        if hub is None:
            raise FederationConfigError(f"cluster {cluster.name}: its kubeconfig is in a hub Secret, and no hub "
                                        "client was given", hint="pass hub= (the hub cluster's ApiClient)")
        kubeconfig = kubeconfig_from_secret(hub, cluster.secret, cluster=cluster.name)
        return kube_config.new_client_from_config_dict(kubeconfig, context=cluster.context, persist_config=False)
    except ConfigException as exc:
        raise FederationConfigError(f"cluster {cluster.name}: its kubeconfig cannot be used: {one_line(exc)}",
                                    hint="fix the kubeconfig or the cluster's context") from None


def api_clients(config: FederationConfig, *, hub: ApiClient | None = None) -> dict[str, ApiClient]:
    """Every member cluster's ``ApiClient`` (:func:`api_client_for`), by cluster name."""
    return {c.name: api_client_for(c, hub=hub) for c in config.clusters}

