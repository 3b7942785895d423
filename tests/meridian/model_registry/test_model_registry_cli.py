"""``meridian models`` end to end through the real root command (its entry point, its one-line errors), on the
real Redis under the test's key prefix, with checkpoints written by each tier's own code."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from meridian.cli import build_app
from tests.model_registry_helpers import autoscaling_checkpoint, placement_checkpoint, routing_checkpoint
from tests.redis_helpers import free_port

Invoke = Callable[..., Result]


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    return build_app()


@pytest.fixture
def models(app: typer.Typer, redis_url: str, key_prefix: str, tmp_path: Path) -> Invoke:
    """Run ``meridian models <args>`` against this test's registry."""
    runner = CliRunner()
    options = ["models", "--redis", redis_url, "--key-prefix", key_prefix, "--artifacts", str(tmp_path / "store")]

    def invoke(*args: str) -> Result:
        return runner.invoke(app, [*options, *args])

    return invoke


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def flat_output(result: Result) -> str:
    """The output with rich's box drawing and line wrapping undone."""
    return " ".join(result.output.replace("│", " ").split())


def register(models: Invoke, model: str, checkpoint: Path, *extra: str) -> dict[str, Any]:
    return as_json(models("register", "--model", model, "--checkpoint", str(checkpoint), "--data-window",
                          "2026-11-01/2026-11-29T12:00Z", "--train-command", f"meridian train {model}",
                          "--who", "alice", "--why", "nightly retrain", "--json", *extra))


def test_register_list_show_diff(models: Invoke, tmp_path: Path) -> None:
    first = register(models, "placement", placement_checkpoint(tmp_path / "p1.pt"), "--metrics-json",
                     '{"unschedulable_pods": 12, "gpu_fragmentation": 0.25}', "--data-digest", "cd" * 32)
    assert first["version_id"] == "placement-v1" and first["state"] == "candidate"
    assert first["data_window"] == {"start": "2026-11-01T00:00:00Z", "end": "2026-11-29T12:00:00Z",
                                    "digest": "cd" * 32}
    assert first["feature_layout"]["profiles"] == ["gpu"] and first["registered_by"] == "alice"
    second = register(models, "placement", placement_checkpoint(tmp_path / "p2.pt"), "--parent", "placement-v1",
                      "--metrics-json", '{"unschedulable_pods": 9, "gpu_fragmentation": 0.25, "p99_ms": 3.5}')
    register(models, "routing", routing_checkpoint(tmp_path / "r.pt"))
    register(models, "autoscaling", autoscaling_checkpoint(tmp_path / "a.pt"))
    listed = as_json(models("ls", "--json"))
    assert [v["version_id"] for v in listed] == ["placement-v1", "placement-v2", "routing-v1", "autoscaling-v1"]
    assert [v["version_id"] for v in as_json(models("ls", "--model", "routing", "--json"))] == ["routing-v1"]
    table = models("ls")
    assert table.exit_code == 0 and "placement-v2" in table.stdout and "autoscaling-v1" in table.stdout
    shown = as_json(models("show", "placement-v2", "--json"))
    assert shown["version"] == second and shown["lineage"] == ["placement-v2", "placement-v1"]
    assert [(r["from_state"], r["to_state"], r["who"]) for r in shown["audit"]] == [("none", "candidate", "alice")]
    diff = as_json(models("diff", "placement-v1", "placement-v2", "--json"))
    assert diff["lineage"]["common_ancestor"] == "placement-v1"
    assert diff["lineage"]["b_since_ancestor"] == ["placement-v2"] and diff["lineage"]["a_since_ancestor"] == []
    assert diff["metrics"]["unschedulable_pods"] == {"a": 12.0, "b": 9.0, "delta": -3.0}
    assert diff["metrics"]["p99_ms"] == {"a": None, "b": 3.5, "delta": None}
    assert diff["fields"]["parent"] == {"a": None, "b": "placement-v1"}
    text = models("diff", "placement-v1", "placement-v2")
    assert text.exit_code == 0 and "common ancestor: placement-v1" in text.stdout and "-3" in text.stdout


def test_promote_rollback_and_audit(models: Invoke, tmp_path: Path) -> None:
    for n in (1, 2):
        register(models, "routing", routing_checkpoint(tmp_path / f"r{n}.pt"))
        for state in ("shadow", "canary", "active"):
            moved = as_json(models("promote", f"routing-v{n}", "--to", state, "--who", "bob", "--why",
                                   f"gate passed ({state})", "--evidence-json", '{"decisions": 1000}', "--json"))
            assert moved["version"]["state"] == state
    assert moved["retired"]["version_id"] == "routing-v1"
    assert [(t["version_id"], t["to_state"]) for t in moved["transitions"]] == [("routing-v1", "retired"),
                                                                               ("routing-v2", "active")]
    back = as_json(models("rollback", "routing", "--who", "carol", "--why", "carbon up", "--json"))
    assert (back["version"]["version_id"], back["version"]["state"]) == ("routing-v1", "active")
    assert back["retired"]["version_id"] == "routing-v2"
    audit = as_json(models("audit", "routing", "--json"))
    assert [(r["version_id"], r["from_state"], r["to_state"]) for r in audit[-2:]] == [
        ("routing-v2", "active", "retired"), ("routing-v1", "retired", "active")]
    assert audit[-1]["who"] == "carol" and "carbon up" in audit[-1]["why"]
    assert audit[3]["evidence"] == {"decisions": 1000}
    table = models("audit", "routing")
    assert table.exit_code == 0 and "carol" in table.stdout


@pytest.mark.parametrize(("args", "words"), [
    pytest.param(["ls", "--model", "ranking"], "unknown model 'ranking'", id="unknown-model"),
    pytest.param(["show", "placement-v7"], "unknown model version 'placement-v7'", id="unknown-version"),
    pytest.param(["promote", "placement-v1", "--to", "active", "--why", "x"],
                 "placement-v1 cannot go from candidate to active", id="forbidden-transition"),
    pytest.param(["rollback", "placement", "--why", "x"], "no active version", id="nothing-to-roll-back"),
])
def test_registry_mistakes_are_one_line(models: Invoke, tmp_path: Path, args: list[str], words: str) -> None:
    register(models, "placement", placement_checkpoint(tmp_path / "p.pt"))
    result = models(*args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and words in result.stderr and "Traceback" not in result.output


def test_a_checkpoint_of_another_layout_is_refused(models: Invoke, tmp_path: Path) -> None:
    tampered = placement_checkpoint(tmp_path / "p.pt", node_features=["free_cpu_frac", "free_mem_frac"])
    result = models("register", "--model", "placement", "--checkpoint", str(tampered), "--data-window",
                    "2026-11-01/2026-11-02", "--train-command", "t")
    assert result.exit_code == 2
    assert "error: placement checkpoint refused" in result.stderr and "node features missing" in result.stderr
    assert as_json(models("ls", "--json")) == []


@pytest.mark.parametrize(("args", "words"), [
    pytest.param(["--metrics-json", "{not json"], "not valid JSON", id="metrics-not-json"),
    pytest.param(["--metrics-json", '{"f1": "high"}'], "every metric must be a number", id="metric-not-a-number"),
    pytest.param(["--data-window", "2026-11-05"], "is not START/END", id="window-without-end"),
    pytest.param(["--data-window", "2026-11-05/2026-11-01"], "ends", id="window-backwards"),
    pytest.param(["--data-digest", "abc"], "64 lower-case hex digits", id="digest-not-sha256"),
    pytest.param(["--checkpoint", "/nonexistent/model.pt"], "does not exist", id="no-checkpoint-file"),
])
def test_bad_register_options(models: Invoke, tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "p.pt").write_bytes(b"never read: the options are refused first")
    base = {"--data-window": "2026-11-01/2026-11-02", "--metrics-json": "{}", "--checkpoint": str(tmp_path / "p.pt")}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [part for pair in base.items() for part in pair]
    result = models("register", "--model", "placement", "--train-command", "t", *flat)
    assert result.exit_code == 2 and words in flat_output(result)


def test_unknown_state_is_a_usage_error(models: Invoke) -> None:
    result = models("promote", "placement-v1", "--to", "live", "--why", "x")
    assert result.exit_code == 2 and "'live' is not a state" in flat_output(result)


def test_unreachable_redis(app: typer.Typer, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(app, ["models", "--redis", url, "--artifacts", str(tmp_path), "ls", "--json"])
    assert result.exit_code == 2
    assert f"error: Redis at {url} is unreachable" in result.stderr and "--redis" in result.stderr
