"""The live registry reads its regions and clusters from the federation file (``registry.config_file``) only:
a brand-new region written in the file is routed to (its features, its round trips) with no code change;
link overrides win over distances; the file's cluster → region map wins over a summary's; a summary from a
cluster the file does not list is ignored and counted; without a file no region has coordinates."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from global_scheduler.errors import error_details
from global_scheduler.federation_config import FederationConfigError, load_federation_config
from global_scheduler.registry import ClusterRegistry, Fit
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import build_server
from global_scheduler.settings import GlobalSchedulerSettings, RegistrySettings
from meridian.bus import open_bus
from meridian.regions import Location, haversine_km, rtt_ms_for_km
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from protos import telemetry_pb2 as tpb

GIB = 2**30
CORE = 1000

# Two regions the code has never heard of (no table anywhere names them) and one it has.
FEDERATION = """\
regions:
  lunar-base:
    location: {lat: -12.5, lon: 140.25}
    pue: 1.6
    carbon: {zone: XX-MOON}
  atlantis-1:
    location: {lat: 31.0, lon: -24.0}
  eu-north:
    location: {lat: 59.91, lon: 10.75}
clusters:
  - {name: moon-1, region: lunar-base, kubeconfig: kubeconfigs/moon.yaml}
  - {name: sea-1, region: atlantis-1, kubeconfig: kubeconfigs/sea.yaml}
  - {name: north-1, region: eu-north, kubeconfig: kubeconfigs/north.yaml}
links:
  - between: [atlantis-1, eu-north]
    latency_ms: 7.5
"""


def _summary(cluster: str, region: str, *, cores: int = 64, sequence: int = 1, pue: float = 1.2,
             carbon: float = 100.0) -> tpb.ClusterSummary:
    return tpb.ClusterSummary(
        cluster=cluster, region=region, sequence=sequence, generated_unix_ms=1_000_000 + sequence, nodes_total=2,
        nodes_schedulable=2, allocatable=tpb.ResourceVector(milli_cpu=cores * CORE, memory_bytes=256 * GIB),
        free=tpb.ResourceVector(milli_cpu=cores * CORE, memory_bytes=256 * GIB),
        max_node_free_milli_cpu=cores * CORE // 2, max_node_free_memory_bytes=128 * GIB, pue=pue,
        carbon_g_per_kwh=carbon)


@pytest.fixture
def federation_file(tmp_path: Path) -> Path:
    path = tmp_path / "federation.yaml"
    path.write_text(FEDERATION)
    return path


@pytest.fixture
def registry(federation_file: Path) -> ClusterRegistry:
    return ClusterRegistry.from_settings(RegistrySettings(config_file=federation_file))


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_a_new_region_from_the_file_is_routed_to(registry: ClusterRegistry) -> None:
    assert registry.known_regions() == ["lunar-base", "atlantis-1", "eu-north"]  # before any report
    for name, region in (("moon-1", "lunar-base"), ("sea-1", "atlantis-1"), ("north-1", "eu-north")):
        registry.apply(_summary(name, region), now_s=1000.0)
    names, regions, feats = registry.features(now_s=1000.0)
    assert names == ["moon-1", "sea-1", "north-1"] and regions == ["lunar-base", "atlantis-1", "eu-north"]
    assert feats.region_index.tolist() == [0, 1, 2]
    moon, sea, north = Location(-12.5, 140.25), Location(31.0, -24.0), Location(59.91, 10.75)
    rtt = feats.rtt_ms
    assert rtt[0, 0] == 2.0
    assert rtt[0, 1] == pytest.approx(rtt_ms_for_km(haversine_km(moon, sea)))  # from the file's locations
    assert rtt[0, 2] == pytest.approx(rtt_ms_for_km(haversine_km(moon, north)))
    assert rtt[1, 2] == rtt[2, 1] == 7.5  # the link override wins over the distance (~4,000 km: ~63 ms)
    assert rtt_ms_for_km(haversine_km(sea, north)) > 50
    assert np.allclose(rtt, rtt.T)
    assert feats.bandwidth_gbps[0, 1] == 40.0  # intercontinental
    assert feats.pue.tolist() == [1.6, 1.2, 1.2]  # the file's PUE where it gives one, else the summary's
    assert [c.region for c in registry.cluster_messages()] == ["lunar-base", "atlantis-1", "eu-north"]


def test_a_workload_for_a_configured_region_waits_for_its_cluster(registry: ClusterRegistry) -> None:
    registry.apply(_summary("north-1", "eu-north", cores=8), now_s=1000.0)
    outlook = registry.fit_outlook(replicas=2, milli_cpu=16 * CORE, memory_bytes=GIB, gpu=0.0, allowed_regions=None)
    assert outlook.fit is Fit.LATER and outlook.waiting_for == ("lunar-base", "atlantis-1")
    never = registry.fit_outlook(replicas=1, milli_cpu=CORE, memory_bytes=GIB, gpu=0.0, allowed_regions={"venus"})
    assert never.fit is Fit.NEVER and "registry.config_file" in never.reason and "lunar-base" in never.reason


def test_the_file_places_the_cluster_not_the_summary(registry: ClusterRegistry,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    before = _metric("meridian_registry_region_mismatches_total")
    with caplog.at_level(logging.ERROR, logger="global_scheduler.registry"):
        for seq in (1, 2, 3):
            registry.apply(_summary("moon-1", "eu-north", sequence=seq), now_s=1000.0 + seq)
    assert registry.region_of("moon-1") == "lunar-base"
    assert registry.regions() == ["lunar-base"]
    assert _metric("meridian_registry_region_mismatches_total") - before == 3
    errors = [r for r in caplog.records if "moon-1" in r.getMessage()]
    assert len(errors) == 1 and "reports region 'eu-north'" in errors[0].getMessage()  # logged once
    assert registry.carbon_history.day_ahead(["lunar-base"], 1000.0, np.array([100.0]), 1).shape[0] == 1


def test_a_cluster_the_file_does_not_list_is_ignored(registry: ClusterRegistry,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    before = _metric("meridian_registry_unconfigured_summaries_total")
    with caplog.at_level(logging.WARNING, logger="global_scheduler.registry"):
        assert registry.apply(_summary("stray-1", "eu-north"), now_s=1000.0) is False
        assert registry.apply(_summary("stray-1", "eu-north", sequence=2), now_s=1001.0) is False
    assert registry.names() == [] and registry.regions() == [] and registry.region_of("stray-1") is None
    assert _metric("meridian_registry_unconfigured_summaries_total") - before == 2
    warnings = [r for r in caplog.records if "stray-1" in r.getMessage()]
    assert len(warnings) == 1 and "does not list it" in warnings[0].getMessage()
    assert registry.apply(_summary("north-1", "eu-north"), now_s=1000.0) is True  # a listed one is used


def test_without_a_file_no_region_has_coordinates() -> None:
    registry = ClusterRegistry(default_rtt_ms=80.0, configured_regions=("eu-north",))
    registry.apply(_summary("a", "eu-north"), now_s=1000.0)
    registry.apply(_summary("b", "eu-west"), now_s=1000.0)  # accepted: no file, the summary says
    _, regions, feats = registry.features(now_s=1000.0)
    assert regions == ["eu-north", "eu-west"]
    assert feats.rtt_ms.tolist() == [[2.0, 80.0], [80.0, 2.0]]
    assert feats.pue.tolist() == [1.2, 1.2]


def test_a_file_and_registry_regions_are_not_both_given(federation_file: Path) -> None:
    settings = RegistrySettings(config_file=federation_file)
    settings.regions = ["eu-north"]  # as a CLI option would, after validation
    with pytest.raises(FederationConfigError, match="are both set"):
        ClusterRegistry.from_settings(settings)
    with pytest.raises(ValueError, match="not both"):
        ClusterRegistry(configured_regions=("a",), federation=load_federation_config(federation_file))


def test_a_bad_file_stops_the_scheduler_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(FEDERATION.replace("region: eu-north,", "region: eu-nort,"))
    settings = GlobalSchedulerSettings(registry={"config_file": bad}, routing={"policy": "karmada",
                                                                                "worker_process": False},
                                       store={"persist": False})
    with pytest.raises(FederationConfigError, match=r"clusters\[north-1\]\.region: 'eu-nort' is not one of"):
        GlobalScheduler(settings=settings, bus=open_bus("memory://"))


# ------------------------------------------------------------------------------------------ through the API
TOKEN = "t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def api_from_file(redis_url: str, key_prefix: str, federation_file: Path) -> Iterator[api_grpc.GlobalSchedulerStub]:
    settings = GlobalSchedulerSettings(
        api={"listen": "127.0.0.1:0", "auth_tokens": [TOKEN], "max_workers": 8},
        bus={"url": redis_url, "key_prefix": key_prefix, "block_ms": 50},
        registry={"config_file": federation_file}, routing={"policy": "karmada", "worker_process": False})
    engine = GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix))
    assert engine.registry.configured_regions == ("lunar-base", "atlantis-1", "eu-north")
    server = build_server(engine)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield api_grpc.GlobalSchedulerStub(channel)
    channel.close()
    server.stop(0.2)


def test_the_api_knows_the_files_regions_before_any_report(api_from_file: api_grpc.GlobalSchedulerStub) -> None:
    spec = api.WorkloadSpec(name="web", tenant="shop", replicas=1,
                            requests=api.ResourceQuantities(cpu="1", memory="1Gi"), allowed_regions=["lunar-base"])
    ok = api_from_file.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec), metadata=AUTH)
    assert ok.id
    spec.ClearField("allowed_regions")
    spec.allowed_regions.append("venus")
    with pytest.raises(grpc.RpcError) as err:
        api_from_file.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec), metadata=AUTH)
    assert error_details(err.value).reason == "UNKNOWN_REGION"
    assert "known regions: atlantis-1, eu-north, lunar-base" in err.value.details()


def test_meridian_global_scheduler_reads_the_file_and_names_its_mistake(tmp_path: Path) -> None:
    """``--federation-config`` (the variable is read into the same setting: test_federation_config.py)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(FEDERATION.replace("region: eu-north,", "region: eu-nort,"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MERIDIAN_", "KUBERNETES_SERVICE_HOST"))}
    env["MERIDIAN_GLOBAL_ROUTING__WORKER_PROCESS"] = "false"
    args = ["global-scheduler", "--listen", "127.0.0.1:0", "--policy", "karmada", "--federation-config", str(bad)]
    done = subprocess.run([sys.executable, "-m", "meridian.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: federation config {bad}: clusters[north-1].region: 'eu-nort' is not one of the regions "
                      "(lunar-base, atlantis-1, eu-north); fix the file (see docs/federation-config.md)"]
