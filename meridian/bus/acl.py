"""Redis ACL users, one per component: each may run only the commands its code sends, on only the keys
it reads or writes (ARCHITECTURE.md: "Redis is inside the security boundary").

Without them anything that reaches Redis could write telemetry, dispatch orders, events and workload
records, around the API's tokens. With them a node agent's password only appends node reports; it
cannot dispatch a workload, forge an event or touch the workload store.

Each user is a list of :class:`Grant` (one ACL *selector*, Redis >= 7.0: these commands on keys that
match these patterns), so "reads the dispatch stream" and "appends to the events stream" stay apart:
the regional user can consume ``meridian:{<cluster>}:dispatch`` but not append to it. Key access is
``~`` (read and write), ``%R~`` (read only) or ``%W~`` (write only: ``XADD`` needs no read access, so
an agent cannot read other nodes' reports).

The patterns come from the names the code uses: :mod:`meridian.bus.streams` for the streams,
:mod:`meridian.model_registry.keys` for the model registry (each model's keys under its hash tag,
``meridian:models:{<model>}:…``, and the transitions' stream ``meridian:models:events``), and the
global tier's workload buckets and energy ledger (:data:`WORKLOADS_KEYS`, :data:`ENERGY_STREAM`,
:data:`ENERGY_LEDGER_KEYS`, which the core cannot import; ``tests/deploy/test_redis_security.py``
checks them against ``global_scheduler``). Every key sits under the bus's ``key_prefix``.

``python -m meridian.bus.acl [--key-prefix P] [--cluster C]`` prints an ACL file (``redis-server
--aclfile``); ``deploy/base/redis/users.acl`` (also reachable as ``deploy/redis/users.acl``, a link) is
its output with the defaults, and a test keeps them equal; kustomize makes Redis's ACL ConfigMap from it.
The file holds no passwords: Redis's pod adds each user's from its Secret
(``deploy/base/redis/redis.yaml``; the overlays' ``secretGenerator`` makes the Secrets); a user without
one cannot log in. ``--cluster`` narrows the agent and regional users to one cluster's
streams (one Redis per cluster); the default ``*`` lets them reach every cluster's. A cluster's streams carry
its name as a Redis Cluster hash tag (``meridian:{<cluster>}:telemetry``), so each stream's dead-letter stream
(``…:telemetry:dead``) is granted by a pattern of its own.

Hazards: Redis checks the commands a Lua script runs against the caller's ACL too, so the ledger
grant lists the script's commands (``SADD``, ``HINCRBYFLOAT``, …) beside ``EVALSHA``. A command added
to a component's code needs its grant here, or it fails with :class:`~meridian.bus.BusPermissionError`
naming the user, the command and the key.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from meridian.bus.streams import (
    MOVES_STREAM,
    SUMMARY_STREAM,
    carbon_key,
    dead_letter_stream,
    dispatch_stream,
    events_stream,
    telemetry_stream,
    workload_bucket,
)
from meridian.model_registry.keys import PREFIX as MODELS_PREFIX
from meridian.model_registry.keys import ModelKeys

#: The global scheduler's durable workload records, split over hash-tagged buckets
#: (:func:`meridian.bus.streams.workload_bucket`, written by ``global_scheduler.store``).
WORKLOADS_KEYS = workload_bucket(0).split("{", 1)[0] + "*"
#: Energy records for the ledger (``global_scheduler.accounting.consumer.ENERGY_STREAM``).
ENERGY_STREAM = "meridian:energy"
#: The energy ledger's buckets, index, applied sets and metadata (``global_scheduler.accounting.ledger``).
ENERGY_LEDGER_KEYS = "meridian:energy:*"

#: What a consumer-group worker sends: read, acknowledge, claim a dead consumer's entries, create its
#: group (``MKSTREAM``), and the lag and pending gauges (:mod:`meridian.bus.health`).
CONSUME = ("xreadgroup", "xack", "xautoclaim", "xgroup|create", "xinfo|groups", "xpending")
#: The energy ledger: metadata (HSETNX, HGETALL), each cluster's previous summary (HGET, HSET), the apply
#: script (EVALSHA) and what it runs (SADD … HINCRBYFLOAT), and the reports' reads (ZRANGEBYSCORE, HGETALL).
LEDGER = ("evalsha", "hsetnx", "hget", "hgetall", "hset", "zrangebyscore", "sadd", "expire", "zadd",
          "hincrbyfloat")

#: Every key of the model registry: each model's versions, active pointer, history, sequence and audit stream,
#: and the transitions' bus stream (``meridian.model_registry.keys``).
MODELS_KEYS = f"{MODELS_PREFIX}:*"
#: What the registry sends (``ModelRegistry``): its reads (a model's versions, pointer, history, sequence,
#: audit), the optimistic transaction's WATCH and writes, and the transitions' events (XADD with MAXLEN).
#: MULTI, EXEC, DISCARD and UNWATCH name no key: they are the user's keyless commands.
MODELS_MANAGE = ("hgetall", "hget", "get", "lrange", "xrange", "xrevrange", "watch", "hset", "set", "rpop",
                 "rpush", "ltrim", "xadd")
MODELS_TRANSACTION = ("multi", "exec", "discard", "unwatch")
#: What a tier sends to load its active model (``ModelRegistry.active``): the pointer, then the version's record.
MODELS_LOAD = ("get", "hget")


def model_keys(model: str) -> str:
    """The pattern of one model's keys (its hash tag, ``meridian:models:{<model>}:*``)."""
    return ModelKeys(model).versions.rsplit(":", 1)[0] + ":*"


Access = Literal["rw", "r", "w"]
_KEY_RULE: dict[str, str] = {"rw": "~", "r": "%R~", "w": "%W~"}
_GLOB_SPECIAL = "*?[]\\"


@dataclass(frozen=True)
class Grant:
    """One ACL selector: ``commands`` on keys matching ``keys`` (glob patterns, before the key prefix)."""

    commands: tuple[str, ...]
    keys: tuple[str, ...]
    access: Access = "rw"


@dataclass(frozen=True)
class AclUser:
    """A component's Redis user: keyless commands (``PING``; ``SCRIPT LOAD``) plus its grants."""

    name: str
    used_by: str
    grants: tuple[Grant, ...]
    keyless: tuple[str, ...] = ("ping",)


def _family(stream_of: Callable[[str], str], cluster: str) -> str:
    """The name ``stream_of`` gives ``cluster``, for a pattern such as ``*`` that it would refuse."""
    sample = "sample-cluster"
    name = stream_of(sample)
    assert name.count(sample) == 1, name
    return name.replace(sample, cluster)


def users(*, cluster: str = "*") -> tuple[AclUser, ...]:
    """Every component's user; ``cluster`` narrows the agent's and the regional tier's streams."""
    telemetry, dispatch = _family(telemetry_stream, cluster), _family(dispatch_stream, cluster)
    events, every_events = _family(events_stream, cluster), _family(events_stream, "*")
    carbon = _family(carbon_key, "*")
    ledger = (Grant(LEDGER, (ENERGY_LEDGER_KEYS,)),)
    return (
        AclUser("meridian-agent", "node agent (python -m node_agent): appends its node's reports, reads the "
                "grid intensity its carbon source 'redis' names",
                (Grant(("xadd",), (telemetry,), "w"), Grant(("get",), (carbon,), "r"))),
        AclUser("meridian-carbon-feeder", "meridian carbon-feeder: keeps meridian:carbon:<zone> current",
                (Grant(("set",), (carbon,), "w"),)),
        AclUser("meridian-regional", "regional scheduler (telemetry consumer, summary publisher), dispatch "
                "worker and autoscaler: consumes its cluster's telemetry and dispatch streams, appends events, "
                "summaries and dead letters, reads the active placement and autoscaling models",
                (Grant(CONSUME, (telemetry, dispatch)),
                 Grant(("xadd",), (events, SUMMARY_STREAM, dead_letter_stream(telemetry),
                                   dead_letter_stream(dispatch)), "w"),
                 Grant(MODELS_LOAD, (model_keys("placement"), model_keys("autoscaling")), "r"))),
        AclUser("meridian-global", "global scheduler (API, router, dispatch, workload store, in-process energy "
                "accounting, the model registry's ModelService): consumes summaries and events, appends dispatch "
                "orders, keeps the workload buckets, the energy ledger and the model registry",
                (Grant(CONSUME, (SUMMARY_STREAM, every_events)),
                 Grant(("xadd",), (_family(dispatch_stream, "*"), MOVES_STREAM, dead_letter_stream(SUMMARY_STREAM),
                                   dead_letter_stream(every_events)), "w"),
                 Grant(("hset", "hscan", "hdel"), (WORKLOADS_KEYS,)),
                 Grant(MODELS_MANAGE, (MODELS_KEYS,)),
                 *ledger),
                keyless=("ping", "script|load", "wait", *MODELS_TRANSACTION)),
        AclUser("meridian-accounting", "standalone accounting consumer (python -m "
                "global_scheduler.accounting.consumer): consumes energy records and summaries into the ledger",
                (Grant(CONSUME, (ENERGY_STREAM, SUMMARY_STREAM)),
                 Grant(("xadd",), (dead_letter_stream(ENERGY_STREAM), dead_letter_stream(SUMMARY_STREAM)), "w"),
                 *ledger),
                keyless=("ping", "script|load")),
        AclUser("meridian-probe", "Redis's readiness probe (redis-cli ping): no key at all", ()),
    )


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in text)


def acl_rules(user: AclUser, *, key_prefix: str = "") -> str:
    """The rules of ``user`` (what follows ``user <name>`` in an ACL file), without a password."""
    if any(c.isspace() for c in key_prefix):
        raise ValueError(f"a key prefix with white space cannot be written as an ACL pattern: {key_prefix!r}")
    prefix = _glob_escape(key_prefix)
    rules = ["on", "resetchannels", "-@all", *(f"+{c}" for c in user.keyless)]
    for grant in user.grants:
        keys = " ".join(f"{_KEY_RULE[grant.access]}{prefix}{k}" for k in grant.keys)
        rules.append(f"({keys} {' '.join(f'+{c}' for c in grant.commands)})")
    return " ".join(rules)


def render_acl(*, key_prefix: str = "", cluster: str = "*") -> str:
    """An ACL file for ``redis-server --aclfile``: the default user off, one line per component user."""
    lines = ["user default off resetchannels -@all"]
    lines += [f"user {u.name} {acl_rules(u, key_prefix=key_prefix)}" for u in users(cluster=cluster)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meridian.bus.acl", description="Print Meridian's Redis ACL "
                                     "file (users and permissions; passwords are added from Secrets at start).")
    parser.add_argument("--key-prefix", default="", help="the components' key_prefix (default: none)")
    parser.add_argument("--cluster", default="*", help="narrow the agent and regional users to this cluster's "
                        "streams (default: every cluster)")
    args = parser.parse_args(argv)
    sys.stdout.write(render_acl(key_prefix=args.key_prefix, cluster=args.cluster))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
