"""GetEnergyReport on a real gRPC server on loopback, and `meridian report energy` end to end."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import numpy as np
import pytest
import typer
from matplotlib import image
from typer.testing import CliRunner

from global_scheduler import energy_cli
from global_scheduler.accounting.report import ReportQuery, build_report
from global_scheduler.accounting.run_store import load_run
from global_scheduler.accounting.service import add_energy_service, fetch_report
from meridian.cli import CliRoot


@pytest.fixture
def server(sample_run_dir):
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_energy_service(srv, load_run(sample_run_dir))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(grace=None)


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer()
    report = typer.Typer()
    root.add_typer(report, name="report")
    energy_cli.register(CliRoot(app=root, bench=typer.Typer(), train=typer.Typer(), report=report))
    return root


def _run(app, *args):
    return CliRunner().invoke(app, ["report", "energy", *args], env={"COLUMNS": "160"})


def test_remote_report_equals_local(server, sample_run_dir):
    query = ReportQuery(group_by="tenant", bucket_seconds=21600)
    remote = fetch_report(server, query)
    local = build_report(load_run(sample_run_dir), query)
    assert remote.model_dump() == local.model_dump()


@pytest.mark.parametrize(("query", "field"), [
    pytest.param(ReportQuery(regions=["mars"]), "regions: unknown region mars", id="unknown-region"),
    pytest.param(ReportQuery(bucket_seconds=60), "bucket_seconds:", id="bad-bucket"),
])
def test_remote_bad_arguments_are_invalid_argument(server, query, field):
    with pytest.raises(grpc.RpcError) as info:
        fetch_report(server, query)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field)


def test_cli_json_shape(app, sample_run_dir):
    result = _run(app, "--run", str(sample_run_dir), "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["regions"]) == {"eu-north", "eu-central", "eu-west"}
    for totals in report["regions"].values():
        assert {"energy_kwh", "carbon_kg", "cost"} <= set(totals)
    assert report["counterfactual"]["policy"] == "karmada"
    assert sum(t["carbon_kg"] for t in report["regions"].values()) == pytest.approx(report["totals"]["carbon_kg"])


def test_cli_table_csv_and_target(app, sample_run_dir, server):
    table = _run(app, "--run", str(sample_run_dir), "--region", "eu-north", "--by", "cluster")
    assert table.exit_code == 0, table.output
    assert "eu-north-a" in table.output and "karmada (counterfactual" in table.output
    csv_out = _run(app, "--run", str(sample_run_dir), "--bucket", "1d", "--format", "csv")
    assert csv_out.exit_code == 0 and csv_out.output.splitlines()[0].startswith("start,end,region")
    assert len(csv_out.output.splitlines()) == 1 + 2 * 3  # two days × three regions
    live = _run(app, "--target", server, "--format", "json")
    assert live.exit_code == 0, live.output
    assert json.loads(live.output)["totals"] == json.loads(_run(app, "--run", str(sample_run_dir), "--format",
                                                                "json").output)["totals"]


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--region", "mars"], "unknown region mars", id="unknown-region"),
    pytest.param(["--since", "2022-12-02", "--until", "2022-12-01"], "must be after since", id="until-before-since"),
    pytest.param(["--since", "yesterday-ish"], "ISO 8601", id="bad-time"),
    pytest.param(["--bucket", "soon"], "not a duration", id="bad-bucket"),
    pytest.param(["--by", "colour"], "not one of", id="bad-group"),
    pytest.param(["--format", "xml"], "not one of", id="bad-format"),
    pytest.param(["--plot", "out.svg"], "PNG", id="plot-not-png"),
])
def test_cli_bad_arguments(app, sample_run_dir, args, message):
    result = _run(app, "--run", str(sample_run_dir), *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()).replace("│", "").replace("  ", " ")


def test_cli_needs_one_source(app, tmp_path):
    assert _run(app).exit_code == 2
    missing = _run(app, "--run", str(tmp_path))
    assert missing.exit_code == 2 and "no manifest.json" in missing.output


@pytest.mark.parametrize("source", ["run", "target"])
def test_plot_is_a_real_picture(app, sample_run_dir, server, tmp_path, source):
    png = tmp_path / "energy.png"
    where = ["--run", str(sample_run_dir)] if source == "run" else ["--target", server]
    result = _run(app, *where, "--plot", str(png))
    assert result.exit_code == 0, result.output
    assert png.stat().st_size > 30_000
    pixels = image.imread(png)
    assert pixels.shape[0] > 400 and pixels.shape[1] > 800
    # Not a blank canvas: lines and bars in several colours.
    assert float(np.std(pixels[..., :3])) > 0.05
    assert len(np.unique(pixels[..., :3].reshape(-1, 3).round(2), axis=0)) > 50
