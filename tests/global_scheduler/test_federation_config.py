"""The federation file (``global_scheduler.federation_config``): the example loads, every field is documented,
mistakes are one line naming the file and the field, and a member's ApiClient is built from a kubeconfig file
or from the kubeconfig in a hub Secret (no API server: building a client contacts none)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from global_scheduler.federation_config import (
    CarbonConfig,
    ClusterConfig,
    FederationConfig,
    FederationConfigError,
    LinkConfig,
    LocationConfig,
    RegionConfig,
    SecretRef,
    api_client_for,
    api_clients,
    load_federation_config,
    parse_federation_config,
)
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.errors import describe
from meridian.regions import Region

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "federation.yaml"
DOC = ROOT / "docs" / "federation-config.md"

MINIMAL = """\
regions:
  eu-north: {location: {lat: 59.91, lon: 10.75}}
  eu-central: {location: {lat: 50.11, lon: 8.68}}
clusters:
  - {name: north-1, region: eu-north, kubeconfig: north.yaml}
"""


def _write(tmp_path: Path, text: str, name: str = "federation.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------- the example
def test_the_example_loads() -> None:
    cfg = load_federation_config(EXAMPLE)
    assert cfg.source == str(EXAMPLE)
    assert cfg.region_names == ("eu-north", "eu-central", "us-west")
    assert cfg.cluster_regions() == {"north-1": "eu-north", "central-1": "eu-central", "west-1": "us-west"}
    north = cfg.region("eu-north")
    assert north is not None and north.carbon is not None
    assert north.carbon.zone == "NO" and north.carbon.year == 2023  # NO is Norway, not YAML 1.1's false
    assert north.carbon.file == EXAMPLE.parent / "../../shared/traces/carbon/electricitymaps/NO_2023_hourly.csv"
    central = cfg.cluster("central-1")
    assert central is not None and central.context == "central-1"
    assert central.kubeconfig == EXAMPLE.parent / "kubeconfigs" / "members.yaml"  # relative to the file
    assert all(c.secret is None for c in cfg.clusters)  # hub-less
    assert cfg.link_overrides() == {frozenset({"eu-north", "eu-central"}): 18.0}
    core = cfg.core_regions()["eu-central"]
    assert core == Region("eu-central", "DE", 2020, "DE-LU", 1.30, 50.11, 8.68)


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field of ``model`` as the doc writes it: ``regions[].location.lat``."""
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        nested = [a for a in _args(info.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        is_list = "list[" in str(info.annotation)
        for sub in nested:
            out.extend(_field_paths(sub, f"{path}[]." if is_list else f"{path}."))
    return out


def _args(annotation: Any) -> list[Any]:
    out = [annotation]
    for arg in getattr(annotation, "__args__", ()):
        out.extend(_args(arg))
    return out


def test_every_field_is_documented() -> None:
    doc = DOC.read_text()
    paths = _field_paths(FederationConfig)
    assert {"regions[].location.lat", "clusters[].secret.key", "links[].latency_ms", "regions[].carbon.zone"} <= \
        set(paths)
    missing = [p for p in paths if f"`{p}`" not in doc]
    assert missing == []
    documented = set(re.findall(r"^\| `([a-z_\[\].]+)` \|", doc, flags=re.MULTILINE))
    assert documented == set(paths), "the doc's field tables list exactly the model's fields"


def test_every_model_forbids_unknown_keys() -> None:
    for model in (FederationConfig, RegionConfig, LocationConfig, CarbonConfig, ClusterConfig, SecretRef, LinkConfig):
        assert model.model_config.get("extra") == "forbid", model


def test_regions_and_clusters_as_a_map_or_a_list(tmp_path: Path) -> None:
    as_list = """\
regions:
  - {name: eu-north, location: {lat: 59.91, lon: 10.75}}
  - {name: eu-central, location: {lat: 50.11, lon: 8.68}}
clusters:
  north-1: {region: eu-north, kubeconfig: north.yaml}
"""
    a = load_federation_config(_write(tmp_path, MINIMAL, "a.yaml"))
    b = load_federation_config(_write(tmp_path, as_list, "b.yaml"))
    assert a.model_dump() == b.model_dump()
    assert a.clusters[0].kubeconfig == tmp_path / "north.yaml"


def test_absolute_paths_stay_absolute(tmp_path: Path) -> None:
    cfg = load_federation_config(_write(tmp_path, MINIMAL.replace("north.yaml", "/etc/kube/north.yaml")))
    assert cfg.clusters[0].kubeconfig == Path("/etc/kube/north.yaml")


# ---------------------------------------------------------------------------------------------- mistakes
BAD = [
    pytest.param(MINIMAL.replace("region: eu-north,", "region: eu-nort,"),
                 ["clusters[north-1].region: 'eu-nort' is not one of the regions (eu-north, eu-central)"],
                 id="cluster-in-an-unknown-region"),
    pytest.param(MINIMAL.replace("kubeconfig: north.yaml", "kubeconfig: n.yaml, secret: {namespace: m, name: s}"),
                 ["clusters[north-1]: give at most one of kubeconfig", "got both"], id="kubeconfig-and-secret"),
    pytest.param(MINIMAL.replace("kubeconfig: north.yaml", "kubconfig: north.yaml"),
                 ["clusters[north-1].kubconfig: unknown field (did you mean 'kubeconfig'?)"], id="typo"),
    pytest.param(MINIMAL.replace("{lat: 59.91, lon: 10.75}", "{lat: 59.91, lon: 10.75, alt: 3}"),
                 ["regions[eu-north].location.alt: unknown field"], id="unknown-nested-key"),
    pytest.param(MINIMAL + "zones: []\n", ["zones: unknown field"], id="unknown-top-level-key"),
    pytest.param(MINIMAL.replace("name: north-1", "name: North_1"),
                 ["clusters[North_1].name: 'North_1' is not a DNS-1123 label"], id="cluster-name-not-dns"),
    pytest.param(MINIMAL.replace("eu-central: {", "EU Central: {"),
                 ["regions[EU Central].name: 'EU Central' is not a DNS-1123 label"], id="region-name-not-dns"),
    pytest.param(MINIMAL.replace("lon: 10.75}}", "lon: 10.75}, pue: '1.3'}"),
                 ["regions[eu-north].pue: Input should be a valid number, got '1.3'"], id="number-as-string"),
    pytest.param(MINIMAL.replace("lon: 10.75}}", "lon: 10.75}, pue: 0.9}"),
                 ["regions[eu-north].pue: Input should be greater than or equal to 1"], id="pue-below-1"),
    pytest.param(MINIMAL.replace("lat: 59.91", "lat: 95"), ["regions[eu-north].location.lat: Input should be less "
                                                            "than or equal to 90"], id="latitude-out-of-range"),
    pytest.param(MINIMAL.replace("{location: {lat: 59.91, lon: 10.75}}", "{pue: 1.1}"),
                 ["regions[eu-north].location: required"], id="location-missing"),
    pytest.param(MINIMAL.replace("lon: 10.75}}", "lon: 10.75}, carbon: {year: 2023}}"),
                 ["regions[eu-north].carbon: give zone, file or both"], id="carbon-without-a-source"),
    pytest.param("regions:\n  - {name: a, location: {lat: 1, lon: 2}}\n  - {name: a, location: {lat: 1, lon: 2}}\n",
                 ["regions: 'a' is listed 2 times"], id="region-twice"),
    pytest.param(MINIMAL + "  - {name: north-1, region: eu-central, kubeconfig: c.yaml}\n",
                 ["clusters: 'north-1' is listed 2 times"], id="cluster-twice"),
    pytest.param(MINIMAL + "links:\n  - {between: [eu-north, mars], latency_ms: 9}\n",
                 ["links[eu-north, mars].between: 'mars' is not one of the regions"], id="link-to-unknown-region"),
    pytest.param(MINIMAL + "links:\n  - {between: [eu-north, eu-north], latency_ms: 9}\n",
                 ["a link joins two different regions"], id="link-to-itself"),
    pytest.param(MINIMAL + "links:\n  - {between: [eu-north, eu-central], latency_ms: 9}\n"
                 "  - {between: [eu-central, eu-north], latency_ms: 10}\n",
                 ["this pair of regions is given twice"], id="link-twice"),
    pytest.param(MINIMAL + "links:\n  - {between: [eu-north, eu-central], latency_ms: 0}\n",
                 ["latency_ms: Input should be greater than 0"], id="link-latency-zero"),
    pytest.param("regions: {}\n", ["regions: List should have at least 1 item"], id="no-regions"),
    pytest.param("clusters: []\n", ["regions: required"], id="regions-missing"),
    pytest.param("- a\n- b\n", ["the file must be a mapping with regions: and clusters:, got list"], id="not-a-map"),
    pytest.param("regions: [\n", ["not valid YAML (line 2, column 1)"], id="bad-yaml"),
    pytest.param("regions:\n  a: {location: {lat: 1, lon: 2}}\n  a: {location: {lat: 1, lon: 2}}\n",
                 ["not valid YAML (line 3, column 3): key 'a' is given twice"], id="key-twice"),
    pytest.param("regions:\n  a: {name: b, location: {lat: 1, lon: 2}}\n",
                 ["regions 'a' says name: 'b'; a map's key is the name"], id="map-key-and-name-differ"),
    pytest.param(MINIMAL.replace("kubeconfig: north.yaml", "secret: {namespace: m, name: s, key: 'a b'}"),
                 ["clusters[north-1].secret.key: 'a b' is not a Secret data key"], id="bad-secret-key"),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_a_mistake_is_one_line_naming_the_file_and_the_field(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(FederationConfigError) as err:
        load_federation_config(path)
    line = str(err.value)
    assert "\n" not in line
    assert err.value.message.startswith(f"federation config {path}: ")
    for words in expected:
        assert words in line
    assert "docs/federation-config.md" in line
    assert describe(err.value) is err.value  # the CLI prints it as one `error:` line


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    text = MINIMAL.replace("kubeconfig: north.yaml", "kubconfig: north.yaml").replace("lat: 59.91", "lat: '59.91'")
    with pytest.raises(FederationConfigError) as err:
        load_federation_config(_write(tmp_path, text))
    assert "clusters[north-1].kubconfig" in str(err.value) and "regions[eu-north].location.lat" in str(err.value)


def test_a_missing_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(FederationConfigError) as err:
        load_federation_config(tmp_path / "nope.yaml")
    assert str(err.value) == (f"federation config {tmp_path / 'nope.yaml'}: cannot read it: No such file or directory; "
                              "check registry.config_file (MERIDIAN_GLOBAL_REGISTRY__CONFIG_FILE)")


def test_parse_takes_already_read_data() -> None:
    cfg = parse_federation_config(yaml.safe_load(MINIMAL), source="inline", base_dir=Path("/etc/meridian"))
    assert cfg.source == "inline" and cfg.clusters[0].kubeconfig == Path("/etc/meridian/north.yaml")
    with pytest.raises(FederationConfigError, match=r"^federation config inline: clusters\[north-1\]\.region"):
        parse_federation_config(yaml.safe_load(MINIMAL.replace("region: eu-north,", "region: x,")), source="inline")


# ---------------------------------------------------------------------------------------------- settings
def test_the_setting_and_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, MINIMAL)
    monkeypatch.setenv("MERIDIAN_GLOBAL_REGISTRY__CONFIG_FILE", str(path))
    assert GlobalSchedulerSettings().registry.config_file == path
    monkeypatch.setenv("MERIDIAN_GLOBAL_REGISTRY__REGIONS", '["eu-north"]')
    with pytest.raises(ValidationError, match=r"registry\.regions and registry\.config_file are both set"):
        GlobalSchedulerSettings()


# ---------------------------------------------------------------------------------------------- API clients
def _kubeconfig(*contexts: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": contexts[0][0],
        "clusters": [{"name": n, "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                     for n, server in contexts],
        "users": [{"name": "meridian", "user": {"token": "s3cret"}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "meridian"}} for n, _ in contexts],
    }


MEMBERS = (("central-1", "https://127.0.0.1:16443"), ("west-1", "https://127.0.0.1:26443"))


def test_api_client_from_a_kubeconfig_file(tmp_path: Path) -> None:
    (tmp_path / "kubeconfigs").mkdir()
    (tmp_path / "kubeconfigs" / "members.yaml").write_text(yaml.safe_dump(_kubeconfig(*MEMBERS)))
    text = """\
regions:
  eu-central: {location: {lat: 50.11, lon: 8.68}}
  us-west: {location: {lat: 37.34, lon: -121.89}}
clusters:
  - {name: central-1, region: eu-central, kubeconfig: kubeconfigs/members.yaml}
  - {name: west-1, region: us-west, kubeconfig: kubeconfigs/members.yaml, context: west-1}
"""
    cfg = load_federation_config(_write(tmp_path, text))
    clients = api_clients(cfg)
    assert clients["central-1"].configuration.host == "https://127.0.0.1:16443"  # the current context
    assert clients["west-1"].configuration.host == "https://127.0.0.1:26443"  # the named one
    assert "Bearer s3cret" in clients["west-1"].configuration.api_key.values()


def test_api_client_errors_name_the_cluster(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_text(yaml.safe_dump(_kubeconfig(*MEMBERS)))
    missing = ClusterConfig(name="north-1", region="eu-north", kubeconfig=tmp_path / "nope.yaml")
    with pytest.raises(FederationConfigError, match=r"^cluster north-1: kubeconfig .*nope.yaml does not exist"):
        api_client_for(missing)
    no_context = ClusterConfig(name="north-1", region="eu-north", kubeconfig=tmp_path / "k.yaml", context="mars")
    with pytest.raises(FederationConfigError, match=r"^cluster north-1: its kubeconfig cannot be used"):
        api_client_for(no_context)
    in_secret = ClusterConfig(name="north-1", region="eu-north", secret=SecretRef(namespace="m", name="s"))
    with pytest.raises(FederationConfigError, match="no hub client was given"):
        api_client_for(in_secret)
    # Members pull their work: a cluster the hub has no way into is a valid member; only tools that look in fail.
    pulled = ClusterConfig(name="north-1", region="eu-north")
    with pytest.raises(FederationConfigError, match="no way to reach its API server"):
        api_client_for(pulled)


def test_a_cluster_without_access_is_a_member_that_pulls_its_work(tmp_path: Path) -> None:
    config = load_federation_config(_write(tmp_path, MINIMAL.replace(", kubeconfig: north.yaml", "")))
    assert config.cluster_regions() == {"north-1": "eu-north"}
    assert config.cluster("north-1").kubeconfig is None and config.cluster("north-1").secret is None


class _Secrets:
    """Stands in for the hub's CoreV1Api.read_namespaced_secret: the Secrets it holds, by (namespace, name)."""

    def __init__(self, secrets: dict[tuple[str, str], dict[str, str]]) -> None:
        self.secrets = secrets
        self.calls: list[tuple[str, str]] = []

    def __call__(self, name: str, namespace: str) -> Any:
        from kubernetes.client import V1ObjectMeta, V1Secret
        from kubernetes.client.exceptions import ApiException

        self.calls.append((namespace, name))
        data = self.secrets.get((namespace, name))
        if data is None:
            raise ApiException(status=404, reason="Not Found")
        return V1Secret(metadata=V1ObjectMeta(name=name, namespace=namespace), data=data)


def test_api_client_from_a_hub_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client import ApiClient, Configuration, CoreV1Api

    encoded = base64.b64encode(yaml.safe_dump(_kubeconfig(*MEMBERS)).encode()).decode()
    secrets = _Secrets({("meridian-system", "members"): {"value": encoded}})
    monkeypatch.setattr(CoreV1Api, "read_namespaced_secret",
                        lambda api, name, namespace, **_: secrets(name, namespace))
    hub = ApiClient(Configuration(host="https://hub.invalid:6443"))
    cluster = ClusterConfig(name="west-1", region="us-west", context="west-1",
                            secret=SecretRef(namespace="meridian-system", name="members", key="value"))
    assert api_client_for(cluster, hub=hub).configuration.host == "https://127.0.0.1:26443"
    assert secrets.calls == [("meridian-system", "members")]

    wrong_key = cluster.model_copy(update={"secret": SecretRef(namespace="meridian-system", name="members")})
    with pytest.raises(FederationConfigError, match=r"^cluster west-1: the Secret meridian-system/members has no "
                       r"key 'kubeconfig' \(keys: value\)"):
        api_client_for(wrong_key, hub=hub)
    absent = cluster.model_copy(update={"secret": SecretRef(namespace="meridian-system", name="gone")})
    with pytest.raises(FederationConfigError, match=r"cannot read the Secret meridian-system/gone in the hub: 404"):
        api_client_for(absent, hub=hub)
    secrets.secrets[("meridian-system", "junk")] = {"kubeconfig": "not base64!"}
    junk = cluster.model_copy(update={"secret": SecretRef(namespace="meridian-system", name="junk")})
    with pytest.raises(FederationConfigError, match="is not a kubeconfig"):
        api_client_for(junk, hub=hub)
