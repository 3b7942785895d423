"""``meridian agent`` (the node agent, real or simulated) and ``meridian carbon-feeder``.

Registering the commands runs on every ``meridian`` start, so the agent's collectors, the bus
(redis), the simulated fleet (numpy, kubernetes) and psutil are imported when a command runs.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from meridian.cli import CliRoot

if TYPE_CHECKING:
    from node_agent.agent import NodeAgent
    from node_agent.settings import AgentSettings

log = logging.getLogger(__name__)


def build_agent(settings: AgentSettings, *, notify: Callable[[str], None] | None = None) -> NodeAgent:
    """Wire collectors, reporter and publisher from settings (no threads started). ``notify`` receives the
    publisher's line when the bus goes away and when it is back (None: they are logged)."""
    from meridian.bus import open_bus, telemetry_stream
    from meridian.carbon_feed import CarbonFeed
    from meridian.fleet import SimulatedFleet
    from node_agent.agent import NodeAgent, NodeReporter, Reporter, SimulatedReporter
    from node_agent.collectors.carbon import CarbonCollector
    from node_agent.collectors.kube import KubeNodeCollector, local_node_info
    from node_agent.collectors.power import PowerCollector
    from node_agent.collectors.usage import CgroupUsage, ProcUsage
    from node_agent.publisher import ReportPublisher

    bus = open_bus(settings.bus_url, key_prefix=settings.key_prefix)
    carbon = CarbonCollector(source=settings.carbon.source, static_g_per_kwh=settings.carbon.g_per_kwh,
                             bus=bus, zone=settings.carbon.zone)
    feed = None
    if settings.carbon.file is not None:
        feed = CarbonFeed.from_file(settings.carbon.file, offset_s=settings.carbon.offset_s,
                                    column=settings.carbon.column)
        if settings.carbon.source == "file":
            carbon.feed = feed
    reporter: Reporter
    if settings.simulate.nodes:
        reporter = SimulatedReporter(SimulatedFleet(
            cluster=settings.cluster, region=settings.region, n_nodes=settings.simulate.nodes,
            seed=settings.simulate.seed, node_list=settings.simulate.node_list, carbon=feed,
            carbon_g_per_kwh=settings.carbon.g_per_kwh, pue=settings.pue, labels_every=settings.publish.labels_every))
    else:
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        use_kube = settings.kube.enabled if settings.kube.enabled is not None else \
            in_cluster or settings.kube.kubeconfig is not None
        kube = KubeNodeCollector(settings.node_name, refresh_s=settings.kube.refresh_s,
                                 kubeconfig=settings.kube.kubeconfig) if use_kube else None
        node = (kube.read(0.0) if kube else None) or local_node_info(settings.node_name)
        reporter = NodeReporter(
            cluster=settings.cluster, region=settings.region, node=node, pue=settings.pue,
            usage=ProcUsage(settings.usage.proc_root), cgroup=CgroupUsage(settings.usage.cgroup_root),
            power=PowerCollector(node.capacity_milli_cpu / 1000, powercap_root=settings.power.powercap_root,
                                 idle_watts=settings.power.idle_watts, max_watts=settings.power.max_watts),
            carbon=carbon, kube=kube, labels_every=settings.publish.labels_every)
    publisher = ReportPublisher(bus=bus, stream=telemetry_stream(settings.cluster),
                                buffer_max=min(settings.publish.buffer_reports_per_node * reporter.n_nodes,
                                               settings.publish.buffer_max_reports),
                                maxlen=settings.publish.stream_maxlen, backoff_s=settings.publish.backoff_s,
                                notify=notify)
    return NodeAgent(reporter=reporter, publisher=publisher, interval_s=settings.publish.interval_s,
                     jitter_s=settings.publish.jitter_s, seed=settings.node_name)


def agent(
    cluster: str = typer.Option(None, help="Cluster (default: MERIDIAN_AGENT_CLUSTER or 'local')."),
    region: str = typer.Option(None, help="Region (default: MERIDIAN_AGENT_REGION)."),
    bus_url: str = typer.Option(None, "--bus-url", help="Redis URL (default: MERIDIAN_AGENT_BUS_URL)."),
    simulate_nodes: int = typer.Option(None, "--simulate-nodes", help="Publish for N simulated nodes."),
    node_list: Path | None = typer.Option(None, "--node-list", help="openb node list CSV for simulated shapes."),
    carbon_file: Path | None = typer.Option(None, "--carbon-file", help="Carbon series CSV to report from."),
    interval_s: float = typer.Option(None, "--interval-s", help="Seconds between reports."),
    health_port: int = typer.Option(None, "--health-port", help="Port of /healthz, /readyz, /metrics."),
    health_address: str = typer.Option(None, "--health-address", help="Bind address of the health server "
                                       "(default: all interfaces in a pod, loopback elsewhere)."),
    ticks: int = typer.Option(0, help="Stop after this many reports (0 = run until Ctrl-C)."),
) -> None:
    """Run the node agent: report this node (or a simulated fleet) to the cluster's telemetry stream."""
    from meridian.bus import telemetry_stream
    from node_agent.health import HealthServer
    from node_agent.settings import AgentSettings

    settings = AgentSettings()
    updates: dict[str, object] = {k: v for k, v in {"cluster": cluster, "region": region, "bus_url": bus_url,
                                                     "health_port": health_port, "health_address": health_address}.items()
                                    if v is not None}
    settings = settings.model_copy(update=updates)
    if simulate_nodes is not None or node_list is not None:
        settings.simulate = settings.simulate.model_copy(update={
            k: v for k, v in {"nodes": simulate_nodes, "node_list": node_list}.items() if v is not None})
    if carbon_file is not None:
        settings.carbon = settings.carbon.model_copy(update={"source": "file", "file": carbon_file})
    if interval_s is not None:
        settings.publish = settings.publish.model_copy(update={"interval_s": interval_s})
    from meridian.bus import redact_url
    from meridian.errors import bind_error

    node_agent = build_agent(settings, notify=lambda message: typer.echo(f"agent: {message}", err=True))
    try:
        health = HealthServer(port=settings.health_port, address=settings.health_address, live=node_agent.live,
                              ready=node_agent.ready).start()
    except OSError as exc:
        raise bind_error(exc, what="the agent's health", host=settings.health_address, port=settings.health_port,
                         setting="--health-port or MERIDIAN_AGENT_HEALTH_PORT") from exc
    stop = threading.Event()
    typer.echo(f"agent: {node_agent.reporter.n_nodes} node(s) → {telemetry_stream(settings.cluster)} at "
               f"{redact_url(settings.bus_url)} every {settings.publish.interval_s:g} s; health on "
               f"{settings.health_address}:{health.port}")
    try:
        if ticks:
            for _ in range(ticks):
                node_agent.tick()
                if stop.wait(node_agent.next_delay_s()):
                    break
        else:
            node_agent.run(stop)
    except KeyboardInterrupt:
        stop.set()
    finally:
        health.shutdown()
        p = node_agent.publisher
        typer.echo(f"agent: published {p.published_total}, dropped {p.dropped_total}, buffered {len(p.buffer)}")


def carbon_feeder(
    file: Path = typer.Option(..., "--file", help="Carbon series CSV (Electricity Maps or Let's Wait Awhile)."),
    zone: str = typer.Option(..., help="Zone name: the key is meridian:carbon:<zone>."),
    bus_url: str = typer.Option("redis://127.0.0.1:6379/0", "--bus-url"),
    interval_s: float = typer.Option(60.0, "--interval-s", help="Seconds between updates."),
    offset_s: float = typer.Option(0.0, "--offset-s", help="Replay offset into the series (s)."),
) -> None:
    """Keep meridian:carbon:<zone> current from a carbon series (agents read it with carbon source 'redis')."""
    from meridian.bus import open_bus
    from meridian.carbon_feed import CarbonFeed
    from node_agent.collectors.carbon import CarbonFeeder

    feeder = CarbonFeeder(open_bus(bus_url), CarbonFeed.from_file(file, offset_s=offset_s), zone, interval_s)
    stop = threading.Event()
    try:
        feeder.run(stop)
    except KeyboardInterrupt:
        stop.set()


def register(cli: CliRoot) -> None:
    """Add ``agent`` and ``carbon-feeder`` to the ``meridian`` CLI."""
    cli.app.command("agent")(agent)
    cli.app.command("carbon-feeder")(carbon_feeder)
