"""``meridian train placement``'s settings object: defaults, a YAML/JSON file, command-line
overrides (the older option spellings included), ``--print-config``, and errors that name the key."""

from __future__ import annotations

import inspect
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from meridian.cli import build_app
from regional_scheduler.learned import commands
from regional_scheduler.learned.defaults import TRAINING_LISTS
from regional_scheduler.learned.train_settings import (
    PlacementTrainSettings,
    SettingsError,
    dump_yaml,
    option_names,
    resolve_settings,
)

README = Path(commands.__file__).parent / "checkpoints" / "README.md"


def _print_config(*args: str) -> dict:
    result = CliRunner().invoke(build_app(), ["train", "placement", *args, "--print-config"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.output)


def _error(*args: str) -> str:
    result = CliRunner().invoke(build_app(), ["train", "placement", *args, "--print-config"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_the_declared_options_show_the_settings_defaults() -> None:
    # --help shows the declared options' defaults; they must be the settings object's.
    params = inspect.signature(commands.train_placement).parameters
    s = PlacementTrainSettings()
    for name, path in commands._DECLARED.items():
        value = s
        for part in path:
            value = getattr(value, part)
        default = params[name].default.default
        expected = ",".join(value) if isinstance(value, list) else value
        assert default == expected, name
    assert s.gpu.pods == list(TRAINING_LISTS)


def test_defaults_are_the_hyper_parameters_the_committed_runs_assumed() -> None:
    s = PlacementTrainSettings()
    assert (s.profiles, s.seed, s.max_minutes, s.merge, s.init) == (["gpu", "cpu"], 0, 14.0, False, None)
    assert (s.gpu.steps, s.gpu.node_fraction, s.gpu.augment, s.gpu.residual_bound, s.gpu.sigma) == \
        (300_000, 0.15, 0.8, 0.45, 0.2)
    assert (s.gpu.pairs, s.gpu.learning_rate, s.gpu.validation_episodes) == (8, 0.05, 4)
    assert (s.gpu.bc_episodes, s.gpu.bc_every, s.gpu.bc_epochs, s.gpu.bc_parts, s.gpu.bc_learning_rates) == \
        (6, 2, 6, ["head", "mlp"], [1e-2, 3e-3])
    assert s.gpu.from_fgd and s.gpu.gate_unused and s.gpu.gate_gpu_pods is None
    assert (s.cpu.steps, s.cpu.pairs, s.cpu.sigma, s.cpu.learning_rate, s.cpu.episodes_per_eval) == \
        (150_000, 6, 1.0, 0.3, 2)
    assert (s.cpu.bc_episodes, s.cpu.bc_every, s.cpu.bc_epochs) == (10, 1, 6)


def test_every_field_is_documented() -> None:
    for model in (PlacementTrainSettings, type(PlacementTrainSettings().gpu), type(PlacementTrainSettings().cpu)):
        for name, field in model.model_fields.items():
            assert field.description and len(field.description) > 20, f"{model.__name__}.{name}"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_sets_what_it_names_and_leaves_the_rest_at_the_defaults(tmp_path: Path, suffix: str) -> None:
    data = {"seed": 7, "profiles": "cpu", "gpu": {"pods": ["cpu0", "cpu050"], "sigma": 0.3},
            "cpu": {"line_search": "becomes_cpu_full", "line_deltas": "3.05,3.1", "gini_mean_cap": 29}}
    path = tmp_path / f"run{suffix}"
    path.write_text(json.dumps(data) if suffix == ".json" else yaml.safe_dump(data))
    s = resolve_settings(path)
    assert (s.seed, s.profiles, s.gpu.pods, s.gpu.sigma) == (7, ["cpu"], ["cpu0", "cpu050"], 0.3)
    assert (s.cpu.line_deltas, s.cpu.gini_mean_cap) == ([3.05, 3.1], 29.0)
    assert s.gpu.steps == 300_000 and s.cpu.pairs == 6


def test_print_config_writes_a_file_that_reads_back_the_same(tmp_path: Path) -> None:
    s = resolve_settings(options=["--cpu-learning-rate", "1e-05", "--cpu-gini-cap", "28", "--keep-head"])
    path = tmp_path / "dumped.yaml"
    path.write_text(dump_yaml(s))
    assert resolve_settings(path) == s
    assert "# ES perturbation scale" in path.read_text()  # the descriptions travel as comments


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("seed: 5\nmax_minutes: 30\ngpu:\n  steps: 1000\n  gate_unused: false\ncpu:\n  sigma: 0.5\n  pairs: 3\n")
    got = _print_config("--config", str(path), "--seed", "9", "--cpu-sigma", "0.25", "--gate-unused")
    assert got["seed"] == 9 and got["cpu"]["sigma"] == 0.25 and got["gpu"]["gate_unused"] is True  # the command line
    assert got["max_minutes"] == 30 and got["gpu"]["steps"] == 1000 and got["cpu"]["pairs"] == 3  # the file
    # A declared option left at its default does not undo the file's value.
    assert _print_config("--config", str(path))["seed"] == 5


def test_the_older_option_spellings_map_into_the_settings() -> None:
    got = _print_config("--pods", "cpu0,cpu300", "--steps", "10", "--cpu-steps", "0", "--keep-head",
                        "--no-gate-unused", "--gate-gpu-pods", "--node-fraction", "0.3", "--cpu-search-layers",
                        "mlp.2,mlp.4", "--cpu-line-search=becomes_cpu_full", "--cpu-line-deltas", "-1,3.075",
                        "--pod-mix", "default", "--merge")
    assert got["gpu"]["pods"] == ["cpu0", "cpu300"] and got["gpu"]["steps"] == 10 and got["cpu"]["steps"] == 0
    assert got["gpu"]["from_fgd"] is False and got["gpu"]["gate_unused"] is False
    assert got["gpu"]["gate_gpu_pods"] is True and got["gpu"]["node_fraction"] == 0.3
    assert got["cpu"]["search_layers"] == ["mlp.2", "mlp.4"] and got["cpu"]["line_deltas"] == [-1.0, 3.075]
    assert got["gpu"]["pod_mix"] == "default" and got["merge"] is True
    assert {"sigma", "cpu-sigma", "no-gate-unused", "keep-head", "cpu-line-deltas"} <= set(option_names())


def test_the_checkpoint_readme_commands_still_parse() -> None:
    commands_in_readme = [" ".join(line.strip().rstrip("\\") for line in block.splitlines())
                          for block in re.findall(r"^OMP_NUM_THREADS=1 (meridian train placement .*?[^\\])$",
                                                  README.read_text(), flags=re.M | re.S)]
    assert len(commands_in_readme) >= 4
    for command in commands_in_readme:
        got = _print_config(*shlex.split(command)[3:])
        assert got["seed"] in (0, 5), command
    v5 = _print_config(*shlex.split(commands_in_readme[0])[3:])
    assert v5["cpu"]["line_search"] == "becomes_cpu_full" and len(v5["cpu"]["line_deltas"]) == 11
    assert (v5["cpu"]["gini_mean_cap"], v5["cpu"]["validation_episodes"], v5["profiles"]) == (29.0, 100, ["cpu"])


def test_an_unknown_key_in_a_file_is_named_with_the_nearest_one(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("cpu:\n  sigmaa: 0.5\nseeed: 1\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'cpu.sigmaa' \(did you mean 'cpu.sigma'\?\)"):
        resolve_settings(path)
    assert "unknown setting 'seeed'" in _error("--config", str(path))


def test_a_bad_value_names_the_setting_its_option_and_the_value(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"cpu.sigma \(--cpu-sigma\): Input should be greater than or equal"):
        resolve_settings(options=["--cpu-sigma", "-1"])
    with pytest.raises(SettingsError, match=r"gpu.node_fraction \(--node-fraction\).*'lots'"):
        resolve_settings(None, {"gpu": {"node_fraction": "lots"}})
    with pytest.raises(SettingsError, match="profiles"):
        resolve_settings(options=["--profiles", "gpu,tpu"])
    with pytest.raises(SettingsError, match="line_search needs the shifts"):
        resolve_settings(options=["--cpu-line-search", "becomes_cpu_full"])
    assert "no such option '--cpu-sigmaa' (did you mean --cpu-sigma?)" in _error("--cpu-sigmaa", "1")
    assert "profiles (--profiles)" in _error("--profiles", "tpu")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert "must hold a mapping" in _error("--config", str(path))
    path.write_text("seed: [1\n")
    assert "not valid YAML" in _error("--config", str(path))
    assert "cannot read settings file" in _error("--config", str(tmp_path / "missing.yaml"))
