"""The operator commands against a live API: submit a YAML file, get, ls, watch, clusters, cancel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meridian.cli import build_app

TOKEN = "test-token"


@pytest.fixture
def cli_env(federation) -> tuple[object, dict[str, str]]:
    fed = federation()
    return fed, {"MERIDIAN_API": fed.target, "MERIDIAN_TOKEN": TOKEN}


def test_operator_commands(cli_env, tmp_path: Path) -> None:
    fed, env = cli_env
    app, runner = build_app(), CliRunner()
    spec = tmp_path / "web.yaml"
    spec.write_text("name: web\ntenant: shop\nreplicas: 2\nrequests: {cpu: 500m, memory: 1Gi}\n"
                    "allowedRegions: [eu-north, eu-central]\nidempotencyKey: web-1\n")
    out = runner.invoke(app, ["submit", str(spec), "-o", "json"], env=env)
    assert out.exit_code == 0, out.output
    wid = json.loads(out.output)["id"]
    again = runner.invoke(app, ["submit", str(spec), "-o", "json"], env=env)
    assert json.loads(again.output)["id"] == wid
    watch = runner.invoke(app, ["watch", wid, "--until", "running", "--timeout", "30"], env=env)
    assert watch.exit_code == 0 and "RUNNING" in watch.output
    got = runner.invoke(app, ["get", wid, "-o", "json"], env=env)
    assert json.loads(got.output)["state"] == "WORKLOAD_STATE_RUNNING"
    listed = runner.invoke(app, ["ls", "--state", "running", "-o", "json"], env=env)
    assert [w["id"] for w in json.loads(listed.output)] == [wid]
    clusters = runner.invoke(app, ["clusters", "-o", "json"], env=env)
    assert {c["name"] for c in json.loads(clusters.output)} == set(fed.workers)
    cancelled = runner.invoke(app, ["cancel", wid, "-o", "json"], env=env)
    assert cancelled.exit_code == 0 and json.loads(cancelled.output)["state"] == "WORKLOAD_STATE_CANCELLED"


@pytest.mark.parametrize(("args", "env_token", "message"), [
    pytest.param(["get", "missing"], TOKEN, "NOT_FOUND", id="not-found"),
    pytest.param(["get", "missing"], TOKEN, "reason: WORKLOAD_NOT_FOUND", id="not-found-reason"),
    pytest.param(["clusters"], "wrong", "UNAUTHENTICATED", id="bad-token"),
    pytest.param(["clusters"], "wrong", "reason: INVALID_TOKEN", id="bad-token-reason"),
])
def test_errors_are_reported(cli_env, args: list[str], env_token: str, message: str) -> None:
    _, env = cli_env
    out = CliRunner().invoke(build_app(), args, env={**env, "MERIDIAN_TOKEN": env_token})
    assert out.exit_code == 2 and message in out.output


def test_bad_workload_file(cli_env, tmp_path: Path) -> None:
    fed, env = cli_env
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: web\ncolour: blue\n")
    out = CliRunner().invoke(build_app(), ["submit", str(bad)], env=env)
    assert out.exit_code == 2 and "colour" in out.output
    # A quantity the API would refuse is refused before any call, in the API's words.
    quantity = tmp_path / "q.yaml"
    quantity.write_text("name: web\ntenant: t\nreplicas: 1\nrequests: {cpu: lots}\n")
    out = CliRunner().invoke(build_app(), ["submit", str(quantity)], env=env)
    assert out.exit_code == 2 and f"{quantity}: spec.requests.cpu: not a Kubernetes quantity" in out.output
    assert len(fed.engine.store) == 0
