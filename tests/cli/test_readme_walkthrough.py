"""The README's walk-through, run as written (issue 24).

The commands and ``web.yaml`` are read from README.md's "Walk-through" section, so this test breaks when
the README drifts from what works. Each command runs as a real process, in order, in a folder holding
``web.yaml``; only the environment differs from a user's shell: a private ``redis-server`` as the bus
and a free port for the API, given through the components' own variables (``MERIDIAN_GLOBAL_BUS__URL``,
``MERIDIAN_GLOBAL_API__LISTEN``, ``MERIDIAN_DISPATCH_BUS_URL``, ``MERIDIAN_API``), so the commands
stay verbatim. A command ending in ``&`` is started in the background, as the shell would, and the
next command waits until it is up (the API answers; the cluster has reported), as a reader would.
About 35 s on two busy cores, half of it the global scheduler's start (the GNN and its routing process).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from meridian.envtest import wait_for
from tests.conftest import RedisServer, free_port

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### Walk-through"
COMMAND_TIMEOUT_S = 60


def walkthrough() -> tuple[str, list[str]]:
    """(web.yaml's text, the commands) from the README's walk-through: its one yaml and one bash block."""
    text = README.read_text()
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    section = re.split(r"^#{2,3} ", text.split(SECTION, 1)[1], flags=re.MULTILINE)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    yamls = [body for lang, body in blocks if lang == "yaml"]
    shells = [body for lang, body in blocks if lang in ("bash", "sh", "shell")]
    assert len(yamls) == 1 and len(shells) == 1, "the walk-through holds one yaml block (web.yaml) and one bash block"
    commands = [line for line in shells[0].replace("\\\n", " ").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    return yamls[0], commands


def test_the_readme_names_a_region_web_yaml_allows() -> None:
    """The failure this test exists for: a worker in region `local` and a workload allowed eu-north/eu-west."""
    web, commands = walkthrough()
    allowed = yaml.safe_load(web)["allowed_regions"]
    worker = next(shlex.split(c, comments=True) for c in commands if "regional_scheduler.dispatch_worker" in c)
    assert worker[worker.index("--region") + 1] in allowed


class Walk:
    """Runs the README's commands; keeps the background ones to stop them afterwards."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.background: list[tuple[list[str], subprocess.Popen[bytes], Path]] = []
        self.outputs: list[tuple[str, str]] = []

    def start(self, argv: list[str]) -> None:
        log = self.workdir / f"background-{len(self.background)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=self.workdir, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own group: the routing worker goes with it
        self.background.append((argv, proc, log))

    def run(self, argv: list[str]) -> str:
        proc = subprocess.run(argv, cwd=self.workdir, env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
        output = proc.stdout + proc.stderr
        self.outputs.append((shlex.join(argv), output))
        assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{output}\n{self.logs()}"
        return output

    def wait(self, what: str, until, timeout_s: float = 45.0) -> None:
        def ready() -> bool:
            if until():
                return True
            for argv, proc, _ in self.background:
                assert proc.poll() is None, f"{shlex.join(argv)} exited {proc.returncode}:\n{self.logs()}"
            return False

        try:
            wait_for(ready, timeout=timeout_s, message=what)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}:\n{self.logs()}") from None

    def logs(self) -> str:
        return "\n".join(f"---- {shlex.join(argv)}\n{log.read_text(errors='replace')[-3000:]}"
                         for argv, _, log in self.background)

    def stop(self) -> None:
        for _, proc, _ in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc, _ in self.background:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def walk(tmp_path: Path, redis_server: RedisServer) -> Iterator[Walk]:
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)  # `meridian` and `python` of this environment, first on PATH
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERIDIAN_") or k == "MERIDIAN_TRACES"}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "MERIDIAN_GLOBAL_BUS__URL": redis_server.url,
        "MERIDIAN_GLOBAL_API__LISTEN": f"127.0.0.1:{port}",
        "MERIDIAN_DISPATCH_BUS_URL": redis_server.url,
        "MERIDIAN_API": f"127.0.0.1:{port}",
    })
    running = Walk(tmp_path, env)
    yield running
    running.stop()


def _api_serves(port: int) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _reported(port: int, cluster: str) -> bool:
    import grpc

    from protos import global_api_pb2 as api
    from protos import global_api_pb2_grpc as api_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            clusters = api_grpc.GlobalSchedulerStub(channel).ListClusters(api.ListClustersRequest(), timeout=2).clusters
        except grpc.RpcError:
            return False
    return any(c.name == cluster and c.ready for c in clusters)


@pytest.mark.slow
def test_the_walkthrough_runs_as_written(walk: Walk) -> None:
    web, commands = walkthrough()
    (walk.workdir / "web.yaml").write_text(web)
    name = yaml.safe_load(web)["name"]
    port = int(walk.env["MERIDIAN_API"].rpartition(":")[2])
    for line in commands:
        argv = shlex.split(line, comments=True)
        assert "&&" not in argv and "|" not in argv, f"one command per line, please: {line}"
        if argv[-1] == "&":
            argv = argv[:-1]
            walk.start(argv)
            if argv[:2] == ["meridian", "global-scheduler"]:
                walk.wait("the global scheduler to serve", lambda: _api_serves(port))
            elif "regional_scheduler.dispatch_worker" in argv:
                cluster = argv[argv.index("--cluster") + 1]
                walk.wait(f"cluster {cluster} to report", lambda cluster=cluster: _reported(port, cluster))
            else:
                pytest.fail(f"the test does not know when {line!r} is up")
            continue
        output = walk.run(argv)
        if argv[:2] == ["meridian", "ls"]:
            assert name in output and "RUNNING" in output, output  # `ls --state running` lists it
    outputs = dict(walk.outputs)
    assert any(cmd.startswith("meridian submit") for cmd in outputs), "the walk-through submits web.yaml"
    assert any(cmd.startswith("meridian ls --state running") for cmd in outputs), "the walk-through lists it running"
    cancel = next(out for cmd, out in walk.outputs if cmd.startswith("meridian cancel"))
    assert "CANCELLED" in cancel, cancel
