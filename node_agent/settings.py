"""Node-agent settings: nested, typed, documented, read from the environment.

Environment: ``MERIDIAN_AGENT_<FIELD>`` and ``MERIDIAN_AGENT_<GROUP>__<FIELD>`` for nested groups
(e.g. ``MERIDIAN_AGENT_PUBLISH__INTERVAL_S=2``). The node name also reads ``NODE_NAME``, which the
DaemonSet sets from the downward API (``spec.nodeName``).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from meridian.bus.settings import BackoffDelays
from meridian.observability import default_bind_address


class PublishSettings(BaseModel):
    interval_s: float = Field(2.0, gt=0, description="Seconds between reports: the regional state is at most "
                              "this stale plus the consumer's lag; 2 s keeps 100,000 nodes at 50,000 reports/s.")
    jitter_s: float = Field(0.2, ge=0, description="Uniform ± jitter on the interval (s) so a fleet started "
                            "together does not report in lock-step.")
    buffer_reports_per_node: int = Field(900, ge=1, description="Reports buffered per node during a bus outage "
                                         "(900 × 2 s = 30 minutes); older ones are dropped and counted.")
    buffer_max_reports: int = Field(200_000, ge=1, description="Cap on the whole buffer (reports, ~330 bytes "
                                    "each: ~66 MB) whatever the node count, for simulated fleets.")
    stream_maxlen: int = Field(1_000_000, ge=1000, description="Approximate length bound of the cluster's telemetry "
                               "stream (entries): ~20 s of a 100,000-node cluster, ~300 MB of Redis memory.")
    backoff_s: BackoffDelays = Field((0.5, 1.0, 2.0, 5.0, 10.0), description="Delays (s) between publish "
                                     "retries during an outage; the last repeats. Up to 10 s: a whole fleet "
                                     "retries against a recovering Redis, and reports are buffered meanwhile.")
    labels_every: int = Field(30, ge=1, description="Send labels and taints with every Nth report (and the first).")


class UsageSettings(BaseModel):
    proc_root: Path = Field(Path("/proc"), description="procfs of the host (mounted read-only at /host/proc in "
                            "the DaemonSet).")
    cgroup_root: Path = Field(Path("/sys/fs/cgroup"), description="cgroup v2 root holding the kubepods slice.")


class PowerSettings(BaseModel):
    powercap_root: Path | None = Field(Path("/sys/class/powercap"), description="RAPL powercap tree; None or "
                                       "absent → the utilisation model.")
    idle_watts: float | None = Field(None, ge=0, description="Override the model's idle power (W); default: "
                                     "the size-class profile of meridian.power_model.")
    max_watts: float | None = Field(None, ge=0, description="Override the model's full-load power (W).")


class CarbonSettings(BaseModel):
    source: Literal["static", "file", "redis"] = Field("static", description="Where grid intensity comes from.")
    g_per_kwh: float | None = Field(None, ge=0, description="The static intensity (gCO2/kWh), and the fallback "
                                    "before the first good read; unset: reports say CARBON_SOURCE_NONE and the "
                                    "cluster's intensity shows as unknown (not as a 0 g/kWh grid).")
    file: Path | None = Field(None, description="A carbon series CSV (Electricity Maps or Let's Wait Awhile).")
    offset_s: float = Field(0.0, description="Replay offset into the file's series (s).")
    column: Literal["direct", "LCA"] = Field("direct", description="Electricity Maps column.")
    zone: str = Field("", description="Zone whose Redis key meridian:carbon:<zone> is read.")


class KubeSettings(BaseModel):
    enabled: bool | None = Field(None, description="Read the node object from the API; None = when running in a "
                                 "cluster (KUBERNETES_SERVICE_HOST set) or given a kubeconfig.")
    refresh_s: float = Field(30.0, gt=0, description="Seconds between reads of the node object and its pods.")
    kubeconfig: Path | None = Field(None, description="Kubeconfig to read the node with instead of the pod's "
                                    "service account (in-cluster) or KUBECONFIG: an agent run outside the "
                                    "cluster under a given identity (e.g. a ServiceAccount token), as the tests do.")


class SimulateSettings(BaseModel):
    nodes: int = Field(0, ge=0, description="Publish for this many simulated nodes instead of this machine.")
    node_list: Path | None = Field(None, description="openb node list CSV for the simulated node shapes.")
    seed: int = Field(0, description="Random seed of the simulated fleet.")


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MERIDIAN_AGENT_", env_nested_delimiter="__")

    node_name: str = Field(default_factory=socket.gethostname,
                           validation_alias=AliasChoices("NODE_NAME", "MERIDIAN_AGENT_NODE_NAME", "node_name"),
                           description="This node's name (downward API spec.nodeName in the DaemonSet).")
    cluster: str = Field("local", description="Cluster whose stream receives the reports.")
    region: str = Field("local", description="Region, copied into every report.")
    pue: float = Field(1.2, ge=1.0, description="The site's power usage effectiveness (a typical modern data "
                       "centre; hyperscalers report 1.1).")
    bus_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (memory:// only makes sense embedded).")
    key_prefix: str = Field("", description="Prefix of every Redis key, to share one Redis between environments.")
    health_port: int = Field(8089, ge=0, le=65535, description="Port of /healthz, /readyz and /metrics; 0 = free port.")
    health_address: str = Field(default_factory=default_bind_address, description="Bind address of the health "
                                "server: all interfaces inside a pod (probes and scrapes reach the pod IP), "
                                "loopback elsewhere.")
    publish: PublishSettings = Field(default_factory=PublishSettings)
    usage: UsageSettings = Field(default_factory=UsageSettings)
    power: PowerSettings = Field(default_factory=PowerSettings)
    carbon: CarbonSettings = Field(default_factory=CarbonSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    simulate: SimulateSettings = Field(default_factory=SimulateSettings)
