"""The hyper-parameters of ``meridian train placement``, as one documented settings object.

:class:`PlacementTrainSettings` holds everything a training run depends on: the run itself (which
profiles, seed, time cap, output), the ``gpu`` profile's search (openb) and the ``cpu`` profile's
(seed-50x200). Every default is the one the committed checkpoint's runs assume
(``checkpoints/README.md``); each field's ``description`` says what it does and why its default.

Where the values come from, later ones winning (:func:`resolve_settings`):

1. the defaults below;
2. a YAML or JSON file (``--config FILE``), nested like the object: ``seed``, ``profiles``, …,
   ``gpu: {sigma: …}``, ``cpu: {sigma: …}`` (``--print-config`` writes one, with every description
   as a comment);
3. the command line: the everyday options the command declares (``--pods``, ``--steps``,
   ``--seed``, ``--out``, …) and any other setting spelled as its option: a top-level or ``gpu``
   field ``name`` as ``--name VALUE``, a ``cpu`` field as ``--cpu-name VALUE`` (underscores as
   dashes), a flag as ``--name`` / ``--no-name``, and ``--keep-head`` for ``--no-from-fgd``. These are
   the options the command had before it took a settings object, so older command lines still work.

An unknown key or option, or a value out of range, is an error that names it
(:class:`SettingsError`). Imports only the standard library, pydantic and (for a YAML file) PyYAML:
no torch or numpy, so the command can check its settings before loading anything heavy.
"""

from __future__ import annotations

import difflib
import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT, TRAINING_LISTS


class SettingsError(ValueError):
    """A settings file or override that does not make valid :class:`PlacementTrainSettings`."""


def _comma_list(value: Any) -> Any:
    """A comma-separated string (as the command line gives it) as a list; anything else as is."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CommaList = Annotated[list[str], BeforeValidator(_comma_list)]
FloatList = Annotated[list[float], BeforeValidator(_comma_list)]
Profile = Literal["gpu", "cpu"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuTrainSettings(_Section):
    """The ``gpu`` profile (clusters with GPUs): a bounded correction of FGD, trained on openb pod lists."""

    pods: CommaList = Field(
        list(TRAINING_LISTS), min_length=1,
        description="openb pod lists to train on (names like cpu050, or CSV paths). Default: the training "
                    "split of checkpoints/README.md; the other nine lists are held out for evaluation.")
    steps: int = Field(
        300_000, ge=0,
        description="policy-search budget, in environment steps. A step budget (not the time cap) should end "
                    "the search, so that a run is deterministic for a seed.")
    node_fraction: float = Field(
        0.15, ge=0.01, le=1.0,
        description="share of the 1,213 openb nodes in each training episode: smaller episodes are cheaper, "
                    "so the search sees more of them in its budget (the committed profile used 0.3).")
    augment: float = Field(
        0.8, ge=0.0, le=1.0,
        description="share of training episodes whose pod list gets random GPU-model constraints "
                    "(augment.py), so the correction also learns constrained workloads; 0 = off.")
    pod_mix: Literal["", "none", "default"] = Field(
        "", description="'default' = each episode's pod list is drawn from the pods lists pooled, to the "
                        "CPU-only / shared-GPU / one-GPU / multi-GPU counts of openb's default list "
                        "(augment.DEFAULT_MIX); '' (or 'none') = the lists as they are.")
    residual_bound: float = Field(
        0.45, ge=0.01, le=5.0,
        description="bound b of the learned correction to FGD's integer node score: < 0.5 re-ranks only "
                    "FGD's tied best nodes (the safe default), < 1 also the next score bin.")
    from_fgd: bool = Field(
        True, description="start the search from a zero correction, i.e. from FGD itself, so the result is "
                          "kept only if it beats FGD (the normalisation and MLP come from --init or imitation); "
                          "false (--keep-head) starts from the init network's head.")
    gate_unused: bool = Field(
        True, description="the correction never chooses between empty nodes (they keep FGD's first-in-order "
                          "rule): empty nodes are alike, so a correction there only adds noise (policy.py).")
    gate_gpu_pods: bool | None = Field(
        None, description="pods that ask for a GPU keep FGD's node (g = 0) during the search and in the "
                          "checkpoint, so only CPU-only pods are corrected; null = as in --init (off without).")
    search_features: str = Field(
        "correction", description="node features whose head weights the search moves: 'correction' "
                                  "(algorithm.CORRECTION_FEATURES: a linear, cheap correction), 'all' (head "
                                  "and MLP scale) or a comma-separated list of features.")
    sigma: float = Field(
        0.2, ge=1e-4, description="ES perturbation scale, in normalised-feature units: big enough to "
                                  "reorder FGD's ties, small enough to stay near the start.")
    pairs: int = Field(8, ge=1, description="± perturbation pairs per ES generation (2·pairs + 1 episodes).")
    learning_rate: float = Field(0.05, gt=0.0, description="ES (Adam) step on the rank-shaped gradient estimate.")
    validation_episodes: int = Field(
        4, ge=0, description="in-training validation episodes (indices 2,000,000+) that decide between the "
                             "search's result and its start.")
    bc_episodes: int = Field(6, ge=0, description="imitation episodes of FGD (when there is no --init).")
    bc_every: int = Field(2, ge=1, description="imitation: record every n-th placement of an episode.")
    bc_epochs: int = Field(6, ge=0, description="imitation: epochs per stage of bc_parts.")
    bc_parts: CommaList = Field(
        ["head", "mlp"], description="imitation stages in order: the linear head first, then the MLP on the "
                                     "residual (imitation.behaviour_cloning).")
    bc_learning_rates: FloatList = Field(
        [1e-2, 3e-3], description="imitation: one learning rate per stage of bc_parts.")

    @model_validator(mode="after")
    def _one_rate_per_stage(self) -> GpuTrainSettings:
        if len(self.bc_parts) != len(self.bc_learning_rates):
            raise ValueError("bc_parts and bc_learning_rates need one learning rate per imitation stage")
        return self


class CpuTrainSettings(_Section):
    """The ``cpu`` profile (CPU-only clusters): trained on seed-50x200 seeds 1000+ (the benchmark uses 0–9).

    On the command line each field is ``--cpu-<name>``.
    """

    steps: int = Field(150_000, ge=0, description="policy-search budget, in environment steps (0 = no ES "
                                                  "generation, e.g. a line search only).")
    unplaced_penalty: float = Field(
        1.5, ge=0.0, description="return lost per pod that fits nowhere (reward.CPU_REWARD's default).")
    gini_weight: float = Field(
        100.0, ge=0.0, description="return lost per unit of final Gini score / 100 (reward.CPU_REWARD's "
                                   "terminal_fragmentation 100: one Gini point = 1).")
    gini_cap: float | None = Field(
        None, ge=0.0, le=100.0, description="Gini score of an episode above which gini_over_cap applies (a "
                                            "constraint; null = off).")
    gini_mean_cap: float | None = Field(
        None, ge=0.0, le=100.0, description="mean Gini score of each ES candidate's batch of episodes above "
                                            "which gini_over_cap applies (the benchmark's target is a mean "
                                            "over seeds; null = off; may be combined with gini_cap).")
    gini_over_cap: float = Field(
        10.0, ge=0.0, description="return lost per Gini point above gini_cap (each episode) or "
                                  "gini_mean_cap (a batch's mean).")
    episodes_per_eval: int = Field(
        2, ge=1, description="episodes per ES candidate (all candidates of a generation share them: common "
                             "random numbers, so a pair's difference measures the policy, not the luck).")
    pairs: int = Field(6, ge=1, description="± perturbation pairs per ES generation (2·pairs + 1 candidates, each on "
                                           "episodes_per_eval episodes).")
    sigma: float = Field(
        1.0, ge=1e-4, description="ES perturbation scale: larger than the gpu profile's, as the policy ranks by "
                                  "g alone here and must move far to change a ranking.")
    learning_rate: float = Field(0.3, ge=1e-6, description="ES (Adam) step on the rank-shaped gradient estimate.")
    validation_episodes: int = Field(
        10, ge=0, description="in-training validation episodes (seeds 2,001,000+) that decide between the "
                              "search's result and its start.")
    search_features: str = Field(
        "all", description="what the search moves: 'all' (head and MLP scale), 'cpu' "
                           "(algorithm.CPU_SEARCH_FEATURES: the columns that vary on a CPU-only cluster, and "
                           "mlp_scale) or a comma-separated list of features.")
    search_layers: CommaList = Field(
        [], description="MLP layers whose weights the search moves as well (policy.SEARCHABLE_LAYERS: "
                        "mlp.2, mlp.4); [] = none: the head alone can only switch between a few rankings.")
    line_search: str = Field(
        "", description="before the search, shift this head feature (or mlp_scale) of the start by each of "
                        "line_deltas and keep the best shift on line_episodes episodes (algorithm.line_search); "
                        "'' = no line search.")
    line_deltas: FloatList = Field(
        [], description="shifts to try for line_search, comma-separated on the command line (0, the start "
                        "itself, is always tried).")
    line_episodes: int = Field(200, ge=1, description="episodes per shift of line_search (seeds 3,001,000+).")
    bc_episodes: int = Field(10, ge=0, description="imitation episodes of best-fit (when there is no --init).")
    bc_every: int = Field(1, ge=1, description="imitation: record every n-th placement of an episode.")
    bc_epochs: int = Field(6, ge=0, description="imitation epochs (the start of the search when there is no --init).")

    @model_validator(mode="after")
    def _line_search_has_shifts(self) -> CpuTrainSettings:
        if self.line_search and not self.line_deltas:
            raise ValueError("line_search needs the shifts to try in line_deltas")
        return self


class PlacementTrainSettings(_Section):
    """Everything ``meridian train placement`` depends on (see the module's docstring for the sources)."""

    profiles: Annotated[list[Profile], BeforeValidator(_comma_list)] = Field(
        ["gpu", "cpu"], min_length=1,
        description="which profiles to train, in order: gpu (openb) and/or cpu (seed-50x200).")
    seed: int = Field(0, description="random seed: training is deterministic for a seed (one torch thread).")
    max_minutes: float = Field(
        14.0, gt=0.0, description="wall-time cap for the whole run: a safety net; the step budgets normally end "
                                  "the search (a run the cap ends is not reproducible).")
    out: Path = Field(DEFAULT_CHECKPOINT, description="checkpoint to write (its log goes beside it as .json).")
    init: Path | None = Field(
        None, description="start each trained profile's search from this checkpoint's profile of the same name "
                          "(an older feature layout is carried over with zero weight on the new features) "
                          "instead of imitation.")
    merge: bool = Field(False, description="keep the profiles of an existing out that this run does not train.")
    gpu: GpuTrainSettings = Field(default_factory=GpuTrainSettings, description="the gpu profile's settings (--NAME on the command line).")
    cpu: CpuTrainSettings = Field(default_factory=CpuTrainSettings,
                                  description="the cpu profile's settings (--cpu-<name> on the command line).")


SECTIONS = ("gpu", "cpu")
# Option names that do not follow the field names (the command's older spellings).
ALIASES: dict[str, tuple[tuple[str, ...], Any]] = {"keep-head": (("gpu", "from_fgd"), False)}


def _is_flag(annotation: Any) -> bool:
    return annotation in (bool, bool | None)


def option_names() -> dict[str, tuple[tuple[str, ...], Any]]:
    """Command-line option (without ``--``) → (settings path, the value of a flag or None if it takes one)."""
    out: dict[str, tuple[tuple[str, ...], Any]] = {}
    sources: list[tuple[type[BaseModel], tuple[str, ...], str]] = [
        (PlacementTrainSettings, (), ""), (GpuTrainSettings, ("gpu",), ""), (CpuTrainSettings, ("cpu",), "cpu-")]
    for model, path, prefix in sources:
        for name, field in model.model_fields.items():
            if not path and name in SECTIONS:
                continue
            option = prefix + name.replace("_", "-")
            if _is_flag(field.annotation):
                out[option] = ((*path, name), True)
                out["no-" + option] = ((*path, name), False)
            else:
                out[option] = ((*path, name), None)
    return out | ALIASES


def parse_options(args: Sequence[str]) -> dict[str, Any]:
    """``--name VALUE`` / ``--name=VALUE`` / ``--flag`` / ``--no-flag`` arguments as nested overrides."""
    names = option_names()
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        option, eq, value = arg[2:].partition("=") if arg.startswith("--") else (arg, "", "")
        if option not in names or not arg.startswith("--"):
            close = difflib.get_close_matches(option, list(names), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise SettingsError(f"no such option {arg!r}{hint}; `--print-config` lists every setting")
        path, flag = names[option]
        if flag is not None:
            if eq:
                raise SettingsError(f"--{option} is a flag and takes no value")
            value = flag
        elif not eq:
            if i + 1 >= len(args):
                raise SettingsError(f"--{option} needs a value")
            i += 1
            value = args[i]
        _put(overrides, path, value)
        i += 1
    return overrides


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) \
            else value
    return out


def load_file(path: Path) -> dict[str, Any]:
    """A settings file's mapping: JSON for ``.json``, YAML (which also reads JSON) otherwise."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc}") from exc
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SettingsError(f"settings file {path} is not valid JSON: {exc}") from exc
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SettingsError(f"settings file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} must hold a mapping of setting names to values")
    return data


def _option_of(loc: tuple[str, ...]) -> str:
    """The command-line spelling of a settings path, e.g. ``("cpu", "sigma")`` → ``--cpu-sigma``."""
    name = {"cpu": "cpu-" + loc[-1], "gpu": loc[-1]}.get(loc[0], loc[0]) if len(loc) > 1 else loc[0]
    return "--" + name.replace("_", "-")


def _describe(error: Mapping[str, Any]) -> str:
    """One validation error as a line that names the setting (and its option) and the bad value."""
    loc = tuple(str(p) for p in error["loc"] if not isinstance(p, int))
    key = ".".join(loc)
    if error["type"] == "extra_forbidden":
        fields = (PlacementTrainSettings if len(loc) == 1 else
                  {"gpu": GpuTrainSettings, "cpu": CpuTrainSettings}.get(loc[0], PlacementTrainSettings)).model_fields
        close = difflib.get_close_matches(loc[-1], list(fields), n=1)
        hint = f" (did you mean {'.'.join([*loc[:-1], close[0]])!r}?)" if close else ""
        return f"unknown setting {key!r}{hint}"
    if not loc or (len(loc) == 1 and loc[0] in SECTIONS):  # a check across fields, or a section that is no mapping
        return f"{key or 'settings'}: {error['msg']}"
    return f"{key} ({_option_of(loc)}): {error['msg']} (got {error['input']!r})"


def resolve_settings(file: Path | None = None, overrides: Mapping[str, Any] | None = None,
                     options: Sequence[str] = ()) -> PlacementTrainSettings:
    """The defaults, then ``file``, then ``overrides`` (nested, like the object), then ``options``
    (command-line arguments, :func:`parse_options`), validated."""
    data = load_file(file) if file is not None else {}
    data = _merged(_merged(data, overrides or {}), parse_options(options))
    try:
        return PlacementTrainSettings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError("invalid training settings:\n  " + "\n  ".join(_describe(e) for e in exc.errors())) \
            from None


def dump_yaml(settings: PlacementTrainSettings) -> str:
    """The settings as a YAML file :func:`resolve_settings` reads back, each field's description a comment."""
    lines = ["# meridian train placement settings (regional_scheduler/learned/train_settings.py).",
             "# Use with --config FILE; command-line options override the file."]

    def emit(model: BaseModel, indent: str) -> None:
        for name, field in type(model).model_fields.items():
            value = getattr(model, name)
            lines.extend(textwrap.wrap(field.description or "", 100, initial_indent=indent + "# ",
                                       subsequent_indent=indent + "# "))
            if isinstance(value, BaseModel):
                lines.append(f"{indent}{name}:")
                emit(value, indent + "  ")
            else:
                lines.append(f"{indent}{name}: {json.dumps(model.model_dump(mode='json')[name])}")

    emit(settings, "")
    return "\n".join(lines) + "\n"
