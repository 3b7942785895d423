"""Settings of the global scheduler, nested and read from the environment.

Environment variables use the prefix ``MERIDIAN_GLOBAL_`` and ``__`` between levels, e.g.
``MERIDIAN_GLOBAL_API__LISTEN=0.0.0.0:50051`` or ``MERIDIAN_GLOBAL_API__AUTH_TOKENS='["s3cret"]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from meridian.bus.settings import ConsumerSettings


class ApiSettings(BaseModel):
    listen: str = Field("127.0.0.1:50051", description="host:port of the gRPC API. Loopback by default; "
                        "bind 0.0.0.0 only with TLS and tokens configured.")
    max_workers: int = Field(32, ge=1, description="gRPC handler threads. Watches hold one each while open, "
                             "so this bounds concurrent watches plus in-flight unary calls.")
    auth_tokens: list[str] = Field(default_factory=list, description="Accepted bearer tokens; empty disables "
                                   "authentication (loopback development only).")
    tls_cert_file: Path | None = Field(None, description="PEM server certificate; with tls_key_file enables TLS.")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file.")
    insecure: bool = Field(False, description="Serve without tokens on an address other than loopback. Refused "
                           "otherwise: anyone who reaches the port could submit and cancel work.")
    max_page_size: int = Field(1000, ge=1, description="Largest ListWorkloads page (workloads).")
    default_page_size: int = Field(100, ge=1, description="ListWorkloads page size when the request gives none.")
    max_page_bytes: int = Field(3 * 2**20, ge=64 * 2**10, description="A ListWorkloads page also ends before its "
                                "serialized size would pass this many bytes (it still holds at least one workload) "
                                "and says where to go on: 3 MiB stays under gRPC clients' default 4 MiB receive limit, "
                                "so a page of big workloads (thousands of replicas' node names) never fails there.")
    max_receive_message_bytes: int = Field(2**20, ge=64 * 2**10, description="Largest request the server reads "
                                           "(gRPC max_receive_message_length); larger ones are RESOURCE_EXHAUSTED "
                                           "before any handler runs. The largest valid SubmitWorkload is under 16 KiB "
                                           "(validation.MAX_SPEC_BYTES); 1 MiB leaves room and stays cheap.")
    max_watches_total: int | None = Field(None, ge=1, description="Long-lived streams open at once (WatchWorkload, "
                                          "and the open health Watch and reflection streams), each holding a handler "
                                          "thread; beyond it a new one is RESOURCE_EXHAUSTED. None: half of "
                                          "max_workers, so unary calls and health checks keep the other half.")
    max_watches_per_token: int = Field(8, ge=1, description="Streams open at once per bearer token (per peer "
                                       "address for calls without one, and for every call when authentication is "
                                       "off), so one client cannot take every watch slot.")
    reserved_workers: int = Field(4, ge=1, description="Handler threads no stream may take: max_workers must be at "
                                  "least the watch limit plus this, or the API refuses to start.")
    health_listen: str | None = Field(None, description="host:port of a second, plaintext gRPC server that serves "
                                      "only grpc.health.v1 on threads of its own (the kubelet's gRPC probes speak "
                                      "plaintext). grpcio gives a unary call its handler thread before the request "
                                      "arrives, so a flood of large or slow requests can hold every API thread; "
                                      "probes here are still answered. None: health only on the API port.")
    gil_switch_interval_ms: float | None = Field(
        0.5, gt=0, le=100, description="Python's thread switch interval (sys.setswitchinterval) set when the API "
        "starts; None leaves the interpreter's 5 ms. Routed in-process (routing.worker_process off), the router thread "
        "routes batches in Python while handler threads wait for the GIL, so at 5 ms a call can wait several intervals: at 1,000 calls/s on 2 cores the "
        "SubmitWorkload p99 was ~110 ms with 5 ms and ~20 ms with 0.5 ms (docs/results-api.md). Process-wide.")

    @property
    def watch_limit(self) -> int:
        """Streams open at once: max_watches_total, or half of max_workers."""
        return self.max_watches_total if self.max_watches_total is not None else max(1, self.max_workers // 2)


_LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def unsafe_api_reason(api: ApiSettings) -> str | None:
    """Why these API settings must not start, or None. Checked where the port is bound, so a listen
    address changed after the settings were read is checked too."""
    if bool(api.tls_cert_file) != bool(api.tls_key_file):
        given, missing = ("tls_cert_file", "tls_key_file") if api.tls_cert_file else ("tls_key_file", "tls_cert_file")
        return (f"{given} is set but {missing} is not: TLS needs both (MERIDIAN_GLOBAL_API__"
                f"{missing.upper()}); refusing to serve plaintext instead")
    host = api.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"
    loopback = host in _LOOPBACK_HOSTS or host.startswith("127.")
    if not api.auth_tokens and not loopback and not api.insecure:
        return (f"authentication is off (no MERIDIAN_GLOBAL_API__AUTH_TOKENS) and the API would listen on "
                f"{api.listen}, beyond loopback: set tokens, listen on 127.0.0.1, or pass --insecure "
                "(MERIDIAN_GLOBAL_API__INSECURE=true) on a trusted network")
    if api.max_workers < api.watch_limit + api.reserved_workers:
        return (f"max_workers ({api.max_workers}) is below the watch limit ({api.watch_limit}) plus reserved_workers "
                f"({api.reserved_workers}): open watches could take every handler thread and leave unary calls and "
                "health checks waiting; raise MERIDIAN_GLOBAL_API__MAX_WORKERS or lower MAX_WATCHES_TOTAL")
    return None


GlobalConsumer = ConsumerSettings.tailored("GlobalConsumer", batch=1000, backoff_s=(0.1, 0.5, 1.0, 2.0, 5.0),
                                           at_least={"block_ms": 1, "claim_idle_ms": 1})
"""How the global scheduler reads the summary and events streams: up to 1000 entries a read (summaries of
every cluster, events of every dispatch), blocking at least 1 ms (its loops would otherwise poll without
pause), and a first retry after 0.1 s (routing waits on the bus). ``MERIDIAN_GLOBAL_BUS__BLOCK_MS`` (also
spelt ``POLL_BLOCK_MS``), ``__CLAIM_IDLE_MS``, ``__BATCH``, ``__BACKOFF_S``."""


class BusSettings(GlobalConsumer):
    model_config = ConfigDict(extra="ignore")  # as the other groups: an unknown MERIDIAN_GLOBAL_BUS__* is ignored

    url: str = Field("redis://127.0.0.1:6379/0", description="Stream bus URL (redis://…, "
                     "redis+cluster://host:port for a Redis Cluster, or memory://).")
    key_prefix: str = Field("", description="Prefix of every stream and key (tests isolate themselves with it).")
    dispatch_maxlen: int = Field(100_000, ge=1000, description="Approximate bound (entries) of each dispatch "
                                 "stream; a regional worker acknowledges within seconds, so this is hours of backlog.")

    @model_validator(mode="before")
    @classmethod
    def _poll_block_ms(cls, data: Any) -> Any:
        """``poll_block_ms``, the name ``block_ms`` had here before the consumers' settings became one."""
        if isinstance(data, dict) and "poll_block_ms" in data:
            data = dict(data)
            data.setdefault("block_ms", data.pop("poll_block_ms"))
        return data


class RegistrySettings(BaseModel):
    cluster_timeout_s: float = Field(15.0, gt=0, description="A cluster with no summary for this long is down "
                                     "and its workloads are rerouted; 1.5 regional summary intervals (10 s). Only "
                                     "time the bus was readable counts, and a cluster whose summaries arrive less "
                                     "often gets twice its measured interval instead.")
    forget_after_s: float = Field(3600.0, gt=0, description="A cluster silent this long (s) leaves the registry: "
                                  "it is no longer listed, routed to or counted as able to come back, and its "
                                  "region goes with its last cluster unless configured in `regions`. Its "
                                  "workloads were rerouted when it went down (cluster_timeout_s); one still "
                                  "dispatched there is rerouted by reconciliation. Must exceed cluster_timeout_s; "
                                  "an hour outlasts a node-pool upgrade or a long Redis outage.")
    sweep_interval_s: float = Field(1.0, gt=0, description="How often liveness is checked (s).")
    default_rtt_ms: float = Field(80.0, gt=0, description="Round trip assumed between two regions that have no "
                                  "known coordinates (ms): every pair when config_file is unset (with it, the "
                                  "file's locations and links give every round trip).")
    regions: list[str] = Field(default_factory=list, description="Regions this deployment routes between. "
                               "Requests naming none of these (nor a region a cluster reports from) are refused "
                               "with UNKNOWN_REGION even before any cluster has reported; empty: only reporting "
                               "clusters' regions are known, and nothing is judged before the first report. "
                               "With config_file, leave empty: the file's regions are the configured ones.")
    config_file: Path | None = Field(None, description="Federation configuration (YAML; docs/federation-config.md): "
                                     "the regions (location, PUE, price area, carbon zone), the member clusters "
                                     "and their regions, and round-trip overrides. When set it is the source of "
                                     "truth: its regions are the configured regions, round trips come from its "
                                     "locations and links, a cluster's region is the file's, and summaries from "
                                     "clusters it does not list are ignored (counted in "
                                     "meridian_registry_unconfigured_summaries_total). Unset: regions from "
                                     "`regions` and the summaries, every round trip between regions default_rtt_ms.")

    @model_validator(mode="after")
    def _one_source_of_regions(self) -> RegistrySettings:
        if self.config_file is not None and self.regions:
            raise ValueError("registry.regions and registry.config_file are both set: the configuration file "
                             "lists the regions; unset MERIDIAN_GLOBAL_REGISTRY__REGIONS")
        return self

    @model_validator(mode="after")
    def _forget_after_down(self) -> RegistrySettings:
        if self.forget_after_s <= self.cluster_timeout_s:
            raise ValueError(f"registry.forget_after_s ({self.forget_after_s:g} s) must be longer than "
                             f"registry.cluster_timeout_s ({self.cluster_timeout_s:g} s): a cluster is marked down "
                             "(its workloads rerouted) before it is forgotten")
        return self


class RoutingSettings(BaseModel):
    policy: str = Field("gnn", description="Routing policy name (global_scheduler.routing.registry).")
    checkpoint: Path | None = Field(None, description="GNN checkpoint; default: the committed gnn/checkpoints/router.pt.")
    batch_max: int = Field(1024, ge=1, description="Most workloads routed per pass of the router loop; one "
                           "dispatch pipeline per pass.")
    worker_process: bool = Field(True, description="Route in a child process (global_scheduler.routing_pass) "
                                 "instead of a thread of the API's process, so routing and the gRPC handlers do "
                                 "not share one interpreter lock: at 1,000 submits/s on 2 cores, SubmitWorkload p99 "
                                 "21-26 ms this way and 1.3 s in-process (docs/results-api.md). Costs one "
                                 "process (~0.3 GB with torch) and seconds of start-up; off suits small tests.")
    worker_nice: int = Field(10, ge=0, le=19, description="Niceness added to the routing worker: where cores are "
                             "scarce the kernel runs the API's threads first and routing, which can wait, after "
                             "(bench api, 2 cores, a minute at 1,000/s: SubmitWorkload p99 39.5 / 51.4 ms at "
                             "+10 against 61.1 / 57.9 ms at 0; docs/history/benchmarks-diary.md).")
    worker_timeout_s: float = Field(30.0, gt=0, description="A pass the routing worker has not answered in this "
                                    "long is routed in the API's process and the worker is replaced (s).")
    defer_recheck_s: float = Field(300.0, gt=0, description="A deferred workload is routed again after this "
                                   "long (s); carbon intensity is hourly, so 5 minutes loses nothing.")
    max_attempts: int = Field(5, ge=1, description="Reroutes after rejections or failovers before a workload FAILs.")
    gc_freeze_interval_s: float = Field(1.0, ge=0, description="Every this many seconds the router moves all live "
                                        "objects to the collector's permanent generation (gc.freeze), so full "
                                        "collections stop rescanning the growing workload store: they were the "
                                        "main p99 source at 1,000 submits/s in our runs (30 ms with the collector off vs 136 ms on). 0 = off.")


class ReconcileSettings(BaseModel):
    interval_s: float = Field(30.0, ge=0, description="How often (s) the workloads the store says are DISPATCHED "
                              "are compared with what their clusters report holding; also once at start, after "
                              "the summary backlog is read. A lost dispatch waits about grace_s + interval_s. 0 = off.")
    grace_s: float = Field(60.0, gt=0, description="A workload DISPATCHED this long (s) without news, to a cluster "
                           "up whose summaries made since list all it holds, is published again (same attempt; the "
                           "regional worker places it once, or re-sends its event); to a cluster down or unknown, "
                           "rerouted. Above the regional worker's claim_idle_ms and bus.claim_idle_ms (30 s each: "
                           "what a dead consumer left pending is reclaimed first) and several summary intervals "
                           "(5-10 s), so a dispatch in flight is not taken for a lost one.")


class StoreSettings(BaseModel):
    persist: bool = Field(True, description="Keep accepted workloads in the bus's hash meridian:workloads (Redis) "
                          "so they and their idempotency keys survive a restart; off keeps them in memory only.")
    terminal_retention_s: float = Field(7 * 86400.0, gt=0, description="Failed and cancelled workloads are "
                                        "forgotten (and their idempotency keys freed) this long after their last "
                                        "change, so the store does not grow forever. 7 days: a week of audit.")
    buckets: int = Field(16, ge=1, le=4096, description="Hashes the records are split over "
                         "(meridian:workloads:{bNNN}), each its own Redis Cluster slot. Fixed for the life of the "
                         "data: restore reads buckets 0 … buckets-1.")
    wait_replicas: int = Field(0, ge=0, le=16, description="Replicas that must confirm every record write (Redis "
                               "WAIT) before a submission or a dispatch is acknowledged. 1 on a Redis Cluster or a "
                               "Redis with a replica, so a failover loses no accepted workload; 0: the primary's "
                               "reply is enough (a single Redis).")


class HaSettings(BaseModel):
    """High availability (global_scheduler/leadership.py, docs/high-availability.md): replicas elect a leader on a
    Redis lock with fencing; only the leader routes and dispatches, followers forward API calls to it."""

    enabled: bool = Field(False, description="Run as one of several replicas: elect a leader on the bus's Redis "
                          "(needs a redis:// bus and store.persist). Off: this process routes alone (one replica).")
    advertise: str | None = Field(None, description="host:port other replicas forward API calls to while this "
                                  "one leads (kept next to the lock). None: the API's listen address with its bound "
                                  "port (must then not be a wildcard address).")
    lease_duration_s: float = Field(5.0, gt=0, description="The lock's time to live in Redis (s): a dead leader is "
                                    "replaced within this plus retry_period_s plus the store's restore.")
    renew_deadline_s: float = Field(3.5, gt=0, description="A leader that could not renew for this long (s) stops "
                                    "routing; below lease_duration_s, so it stops before its lease expires anywhere.")
    retry_period_s: float = Field(0.5, gt=0, description="How often (s) the leader renews and a follower tries "
                                  "to take the lock.")
    forward_timeout_s: float = Field(15.0, gt=0, description="How long (s) a follower keeps trying to forward a call "
                                     "while there is no leader (within the caller's deadline); then UNAVAILABLE.")
    lock_key: str = Field("meridian:global:leader", description="The lock's key (its epoch counter: the key "
                          "plus ':epoch'), under bus.key_prefix.")
    forward_ca_file: Path | None = Field(None, description="PEM CA a follower trusts when it forwards to the "
                                         "leader over TLS (the API has tls_cert_file); None: api.tls_cert_file itself "
                                         "(a self-signed certificate shared by the replicas).")
    forward_server_name: str | None = Field(None, description="The name a follower checks the leader's TLS "
                                            "certificate against when it forwards (gRPC's ssl_target_name_override): "
                                            "in Kubernetes the replicas advertise their pod IPs, which the API's "
                                            "certificate need not name; its Service DNS name it does. None: the "
                                            "advertised host.")

    @model_validator(mode="after")
    def _ordered(self) -> HaSettings:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(f"ha: need retry_period_s ({self.retry_period_s:g}) < renew_deadline_s "
                             f"({self.renew_deadline_s:g}) < lease_duration_s ({self.lease_duration_s:g})")
        return self


class ModelsSettings(BaseModel):
    """The model registry (meridian/model_registry, docs/model-lifecycle.md) served to operators on the API port."""

    serve: bool = Field(True, description="Serve ModelService (list, show, promote and roll back model versions; "
                        "the same as `meridian models`) on the API port, behind the API's tokens and TLS, when the "
                        "bus is Redis: the registry lives on the bus's Redis under bus.key_prefix, so any replica "
                        "answers (no leader forwarding). Off, or with a memory:// bus: not served.")
    artifacts: Path = Field(Path("~/.local/share/meridian/models"), description="The registry's artifact store "
                            "(content-addressed checkpoints; `meridian models`' --artifacts default). ModelService "
                            "reads and changes metadata only, so the global scheduler never writes here.")


class GlobalSchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MERIDIAN_GLOBAL_", env_nested_delimiter="__")

    api: ApiSettings = Field(default_factory=ApiSettings)
    bus: BusSettings = Field(default_factory=BusSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    ha: HaSettings = Field(default_factory=HaSettings)
    models: ModelsSettings = Field(default_factory=ModelsSettings)

    @model_validator(mode="after")
    def _ha_needs_one_redis(self) -> GlobalSchedulerSettings:
        if self.ha.enabled and self.bus.url.split("://", 1)[0].endswith("+cluster"):
            raise ValueError("ha.enabled with a Redis Cluster bus (redis+cluster://): the leader lock and the workload "
                             "buckets are checked and written by one script, which a Redis Cluster cannot run across "
                             "slots; run HA on one Redis with a replica (Sentinel), or one replica on a Redis Cluster")
        return self
