"""Every everyday mistake is one line on stderr, ``error: …`` with what to do next, exit status 2 and no
traceback; ``meridian --verbose`` shows the traceback (issue 24). docs/errors.md lists them with the line
each prints; this file is what checks them.

Each mistake runs ``python -m meridian.cli`` in a real process, with ports this test holds, a Redis port
nothing listens on (redis://127.0.0.1:1) and traces folders that are missing or empty. Log records at
INFO (a server's start, which traces folder was read) may come before the error and are not counted.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meridian.cli import build_app

REPO = Path(__file__).resolve().parents[2]
CLOSED_REDIS = "redis://127.0.0.1:1"  # port 1: nothing listens, the connection is refused at once
#: A model registry nobody writes (the local Redis, a key prefix of its own): every read finds nothing.
EMPTY_REGISTRY = "test-everyday-errors-empty-registry:"
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO) ")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``busy``: a port something listens on; ``closed``: a port bound by no listener (connections are
    refused); ``missing``: a folder that does not exist; ``empty``: one that exists and holds no traces."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # held, never listening: nobody else gets it meanwhile
    root = tmp_path_factory.mktemp("traces")
    (root / "empty").mkdir()
    try:
        yield {"busy": str(busy.getsockname()[1]), "closed": str(closed.getsockname()[1]),
               "missing": str(root / "missing"), "empty": str(root / "empty")}
    finally:
        busy.close()
        closed.close()


def meridian(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MERIDIAN_", "KUBERNETES_SERVICE_HOST"))}
    return subprocess.run([sys.executable, "-m", "meridian.cli", *args], cwd=REPO, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)


def the_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line a mistake prints, after checking there is nothing else (logs at INFO aside)."""
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip() and not LOG_RECORD.match(line)]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param(["global-scheduler", "--bus", CLOSED_REDIS], {},
                     ["Redis at redis://127.0.0.1:1 is unreachable", "Connection refused", "redis-server",
                      "--bus or MERIDIAN_GLOBAL_BUS__URL"], id="redis-unreachable-at-start"),
        pytest.param(["global-scheduler"], {"MERIDIAN_GLOBAL_API__AUTH_TOKENS": "s3cret"},
                     ["MERIDIAN_GLOBAL_API__AUTH_TOKENS is not valid JSON",
                      """write a JSON list: MERIDIAN_GLOBAL_API__AUTH_TOKENS='["s3cret"]'"""], id="setting-not-json"),
        pytest.param(["agent"], {"MERIDIAN_AGENT_PUBLISH__BACKOFF_S": "1,2"},
                     ["MERIDIAN_AGENT_PUBLISH__BACKOFF_S='[1, 2]'"], id="agent-setting-not-json"),
        pytest.param(["global-scheduler"], {"MERIDIAN_GLOBAL_API__MAX_WORKERS": "many"},
                     ["MERIDIAN_GLOBAL_API__MAX_WORKERS='many' is not valid", "integer",
                      "fix or unset MERIDIAN_GLOBAL_API__MAX_WORKERS"], id="setting-of-the-wrong-type"),
        pytest.param(["global-scheduler", "--bus", "memory://", "--listen", "127.0.0.1:0", "--policy", "greenest"], {},
                     ["unknown routing policy 'greenest'", "least-carbon, least-carbon-slo", "gnn",
                      "--policy or MERIDIAN_GLOBAL_ROUTING__POLICY"], id="unknown-policy"),
        pytest.param(["global-scheduler", "--bus", "memory://", "--listen", "127.0.0.1:{busy}"], {},
                     ["the global API port {busy} is already in use", "--listen or MERIDIAN_GLOBAL_API__LISTEN"],
                     id="api-port-in-use"),
        pytest.param(["global-scheduler", "--bus", "memory://", "--listen", "127.0.0.1:0", "--metrics-port", "{busy}"],
                     {}, ["the metrics port {busy} is already in use", "--metrics-port"], id="metrics-port-in-use"),
        pytest.param(["agent", "--health-port", "{busy}", "--health-address", "127.0.0.1", "--ticks", "1"], {},
                     ["the agent's health port {busy} is already in use",
                      "--health-port or MERIDIAN_AGENT_HEALTH_PORT"], id="health-port-in-use"),
        pytest.param(["explain"], {"MERIDIAN_TRACES": "{empty}"},
                     ["the traces folder {empty} has no alibaba-gpu-v2023/openb_node_list_gpu_node.csv",
                      "point $MERIDIAN_TRACES"], id="explain-traces-folder-empty"),
        pytest.param(["bench", "routing", "--traces", "{empty}", "--days", "1", "--clusters", "2",
                      "--policies", "round-robin", "--latency-clusters", "0"], {},
                     ["the traces folder {empty} has no", "--traces"], id="bench-routing-traces-folder-empty"),
        pytest.param(["bench", "placement"], {"MERIDIAN_TRACES": "{missing}"},
                     ["$MERIDIAN_TRACES is '{missing}', which is not a folder", "fix or unset $MERIDIAN_TRACES"],
                     id="bench-placement-traces-folder-missing"),
        pytest.param(["ls", "--api", "127.0.0.1:{closed}"], {},
                     ["nothing answers at 127.0.0.1:{closed}", "meridian global-scheduler",
                      "--api or $MERIDIAN_API"], id="api-unreachable"),
        pytest.param(["models", "--redis", CLOSED_REDIS, "ls"], {},
                     ["Redis at redis://127.0.0.1:1 is unreachable", "Connection refused",
                      "--redis (MERIDIAN_MODELS_REDIS_URL)"], id="models-redis-unreachable"),
        pytest.param(["models", "ls", "--model", "scheduler"], {},
                     ["unknown model 'scheduler'", "use placement, routing or autoscaling"], id="models-unknown-model"),
        pytest.param(["models", "--key-prefix", EMPTY_REGISTRY, "show", "placement-v9"], {},
                     ["unknown model version 'placement-v9'", "`meridian models ls`"], id="models-unknown-version"),
        pytest.param(["models", "--key-prefix", EMPTY_REGISTRY, "rollback", "placement", "--why", "regressed"], {},
                     ["placement has no active version to roll back", "an earlier active version"],
                     id="models-nothing-to-roll-back"),
    ],
)
def test_an_everyday_mistake_is_one_line(args: list[str], env: dict[str, str], expected: list[str],
                                         places: dict[str, str]) -> None:
    done = meridian([a.format(**places) for a in args], {k: v.format(**places) for k, v in env.items()})
    line = the_error_line(done)
    for words in expected:
        assert words.format(**places) in line, line


def test_verbose_shows_the_traceback() -> None:
    done = meridian(["--verbose", "global-scheduler", "--bus", CLOSED_REDIS])
    assert done.returncode != 0 and "Traceback" in done.stderr, done.stderr[-3000:]
    assert not any(line.startswith("error: ") for line in done.stderr.splitlines())


def test_an_agent_whose_redis_is_down_says_so_once() -> None:
    """It keeps running and buffering (an outage is not a mistake), but not silently: one line names
    the stream, the Redis URL, the cause and the buffer against its cap."""
    done = meridian(["agent", "--bus-url", CLOSED_REDIS, "--simulate-nodes", "2", "--interval-s", "0.05",
                     "--ticks", "4", "--health-port", "0"])
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("agent: cannot publish")]
    assert len(said) == 1, done.stderr
    assert "redis://127.0.0.1:1" in said[0] and "Connection refused" in said[0], said[0]
    assert re.search(r"buffering \d+ reports \(cap \d+", said[0]), said[0]
    assert "at redis://127.0.0.1:1 every" in done.stdout  # the start line says where it publishes


@pytest.mark.parametrize(
    "args",
    [pytest.param(["version"], id="a-command"), pytest.param(["--help"], id="help"),
     pytest.param(["global-scheduler", "--help"], id="a-command's-help")],
)
def test_normal_exits_are_untouched(args: list[str]) -> None:
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0 and "error:" not in result.output, result.output
