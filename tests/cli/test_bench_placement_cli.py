import json
from pathlib import Path

from typer.testing import CliRunner

from meridian.cli import build_app

KEYS = {"gpu_alloc_pct_at_100", "unallocated_gpus_at_100", "frag_gpu_pct_at_100", "failure_rate", "cpu_alloc_pct",
        "mem_alloc_pct", "frag_gini", "util_variance", "decision_ms_p50", "decision_ms_p99"}


def test_bench_placement_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(build_app(), ["bench", "placement", "--scenario", "seed-50x200", "--seeds", "2",
                                              "--policies", "least-allocated,best-fit", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"least-allocated", "best-fit"}
    for summary in data["policies"].values():
        assert set(summary) >= KEYS
        assert summary["gpu_alloc_pct_at_100"] is None  # no GPUs in this scenario
    assert data["policies"]["best-fit"]["failure_rate"] < data["policies"]["least-allocated"]["failure_rate"]


def test_unknown_policy_is_rejected() -> None:
    result = CliRunner().invoke(build_app(), ["bench", "placement", "--scenario", "seed-50x200", "--policies", "nope"])
    assert result.exit_code != 0
    assert "unknown placement policy" in result.output


def test_the_bench_is_online_by_default_and_the_paper_protocol_is_asked_for_and_reported(tmp_path: Path) -> None:
    from regional_scheduler import bench_placement as bp
    from regional_scheduler.framework import Scheduler
    from regional_scheduler.policies.registry import get_policy

    full = bp.load_input("openb")
    inp = bp.BenchInput("openb", full.nodes[:150], full.pods)  # ~1,300 arrivals: a quick run
    made: list = []

    def factory(name: str, seed: int) -> Scheduler:
        made.append(get_policy(name))
        return Scheduler(made[-1], seed=seed)

    online = bp.run_one(inp, "fgd", 42, scheduler_factory=factory)
    paper = bp.run_one(inp, "fgd", 42, paper=True, scheduler_factory=factory)
    assert made[0].online_rebuilds >= 1 and made[1].online_rebuilds == 0
    assert online.curve[100]["gpu_alloc_pct"] > 80.0 and paper.curve[100]["gpu_alloc_pct"] > 80.0

    for flags, protocol, title in (([], "online", "online: the past only"),
                                   (["--paper"], "paper", "paper protocol")):
        out = tmp_path / f"{protocol}.json"
        result = CliRunner().invoke(build_app(), ["bench", "placement", "--scenario", "seed-50x200", "--seeds", "1",
                                                  "--policies", "fgd", *flags, "--json", str(out)])
        assert result.exit_code == 0, result.output
        assert title in result.output
        report = json.loads(out.read_text())
        assert report["protocol"] == protocol and report["online"] is (protocol == "online")


def test_bench_reports_seeds_whose_workload_the_gate_left_to_fgd() -> None:
    from regional_scheduler import bench_placement as bp
    from regional_scheduler.learned.augment import spec_like_pod_list

    full = bp.load_input("openb")
    constrained = spec_like_pod_list(full.pods, full.nodes, 1, 0.45)  # above the gpu profile's gate_share 0.30
    for pods, gated in ((constrained, 1), (full.pods, 0)):
        inp = bp.BenchInput("openb", full.nodes[:150], pods)
        learned, fgd = bp.run_one(inp, "learned", 42, paper=True), bp.run_one(inp, "fgd", 42, paper=True)
        summary = bp.summarize([learned], 150)
        assert summary["gated_to_fgd_seeds"] == gated
        if gated:
            assert learned.curve == fgd.curve
