"""``meridian`` starts without importing heavy libraries (issue 24: a fast CLI).

Every command builds the whole command tree first, so one entry point that imports torch, scipy,
matplotlib, numpy or kubernetes at registration slows ``meridian ls`` by seconds. Each check runs
in a fresh interpreter (this test process has long since imported all of them) with an import hook
that records, for the first import of each heavy library, the chain of Meridian modules and
functions that led to it, so a failure names the culprit.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meridian.cli import build_app
from meridian.cli_bench import HEAVY_MODULES

REPO = Path(__file__).resolve().parents[2]

# Runs in the child: argv[1] is the JSON list of heavy modules, argv[2] "app" or an entry point's name.
PROBE = r"""
import json
import sys

HEAVY = set(json.loads(sys.argv[1]))
FIRST_PARTY = ("meridian", "meridian_demo", "regional_scheduler", "global_scheduler", "node_agent", "gnn", "protos")
importers = {}


class RecordHeavyImports:
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in HEAVY and top not in importers:
            chain, frame = [], sys._getframe(1)
            while frame is not None:
                module = frame.f_globals.get("__name__") or "?"
                if module.partition(".")[0] in FIRST_PARTY:
                    where = module if frame.f_code.co_name == "<module>" else f"{module}.{frame.f_code.co_name}()"
                    if not chain or chain[-1] != where:
                        chain.append(where)
                frame = frame.f_back
            importers[top] = " -> ".join(reversed(chain)) + f" -> {fullname}"
        return None


sys.meta_path.insert(0, RecordHeavyImports())
if sys.argv[2] == "app":
    from meridian.cli import build_app

    build_app()
else:
    from importlib.metadata import entry_points

    import typer

    from meridian.cli import CliRoot

    (ep,) = [e for e in entry_points(group="meridian.cli") if e.name == sys.argv[2]]
    ep.load()(CliRoot(app=typer.Typer(), bench=typer.Typer(), train=typer.Typer(), report=typer.Typer()))
print(json.dumps({m: importers.get(m, "?") for m in sorted(HEAVY) if m in sys.modules}))
"""

ENTRY_POINTS = sorted((ep.name, ep.value) for ep in entry_points(group="meridian.cli"))


def heavy_imports_of(target: str) -> dict[str, str]:
    """Heavy module → the chain of imports that first pulled it in, when building ``target``."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY_MODULES), target], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_entry_point_is_checked() -> None:
    # The per-entry-point test below is parametrised from the installed metadata: a stale install
    # (pip install -e . not rerun after pyproject.toml changed) would silently check fewer.
    assert {name for name, _ in ENTRY_POINTS} >= {"regional", "node_agent", "global", "autoscale", "telemetry",
                                                   "energy", "demo"}


@pytest.mark.parametrize(("name", "target"), [pytest.param(n, v, id=n) for n, v in ENTRY_POINTS])
def test_entry_point_registers_without_heavy_imports(name: str, target: str) -> None:
    heavy = heavy_imports_of(name)
    assert not heavy, (f"entry point {name!r} ({target}) imports heavy libraries while registering; import "
                       "them inside the commands that use them:\n"
                       + "\n".join(f"  {m}: {chain}" for m, chain in heavy.items()))


def test_build_app_imports_no_heavy_library() -> None:
    heavy = heavy_imports_of("app")
    assert not heavy, ("meridian.cli.build_app() imports heavy libraries; import them inside the commands "
                       "that use them:\n" + "\n".join(f"  {m}: {chain}" for m, chain in heavy.items()))


def test_help_lists_every_tier() -> None:
    result = CliRunner().invoke(build_app(), ["--help"])
    assert result.exit_code == 0, result.output
    for command in ("ls", "clusters", "agent", "explain", "demo", "bench", "train", "report"):
        assert command in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [pytest.param(["bench", "placement", "--help"], "least-allocated", id="placement-policies-default"),
     pytest.param(["bench", "kubernetes", "--help"], "kube-scheduler,meridian-fgd", id="kubernetes-default"),
     pytest.param(["train", "placement", "--help"], "cpu037", id="train-lists-default"),
     pytest.param(["explain", "--help"], "placement.pt", id="explain-checkpoint-default")],
)
def test_defaults_read_from_light_modules_are_shown(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(build_app(), args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert expected in result.output


def test_defaults_written_where_registration_can_read_them_match_their_sources() -> None:
    from regional_scheduler import bench_kubernetes, cli
    from regional_scheduler.learned import augment, defaults, serving

    kubernetes_default = inspect.signature(cli.bench_kubernetes_command).parameters["schedulers"].default.default
    assert kubernetes_default.split(",")[0] == bench_kubernetes.KUBE_SCHEDULER
    assert serving.DEFAULT_CHECKPOINT == defaults.DEFAULT_CHECKPOINT and defaults.DEFAULT_CHECKPOINT.is_file()
    assert augment.TRAINING_LISTS == defaults.TRAINING_LISTS


def test_bench_cli_times_every_command_beside_the_baseline(tmp_path: Path) -> None:
    out = tmp_path / "cli.json"
    result = CliRunner().invoke(build_app(), ["bench", "cli", "--repeat", "1", "--warmup", "0", "--json", str(out)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    commands = json.loads(out.read_text())["commands"]
    assert list(commands) == ["python -c pass", "meridian --help", "meridian ls --help", "meridian clusters --help",
                              "meridian version"]
    for label, figures in commands.items():
        assert len(figures["samples_ms"]) == 1 and figures["median_ms"] > 0
        if label != "python -c pass":
            assert figures["heavy_modules"] == [], (label, figures["heavy_modules"])
