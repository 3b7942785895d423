"""What the energy report claims must match its figures: "for the same work" only when it was, tenants by
energy, the (unattributed) row explained, the plot's labels in the bars' unit."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from global_scheduler.accounting.plot import counterfactual_caption
from global_scheduler.accounting.report import (
    UNATTRIBUTED_NOTE,
    ReportQuery,
    build_report,
    counterfactual_label,
    counterfactual_sentence,
    render_markdown,
)
from global_scheduler.accounting.run_store import ClusterSpec, RunRecorder, WorkloadUsage, load_run, save_run
from global_scheduler.accounting.service import report_from_proto, report_to_proto
from global_scheduler.accounting.work import WorkDone, carbon_claim, same_work

T0 = datetime(2022, 12, 1, tzinfo=UTC).timestamp()
GNN = WorkDone(replica_hours=1000.0, placed=50, failures=0)


def _run(tmp_path: Path, work: dict[str, WorkDone] | None) -> Path:
    """Two hours on two clusters; the reported policy draws 1 + 2 kW, karmada 1.5 + 1.5 kW (hand run of
    test_accounting_run_store): carbon 2.4 kg against 2.025 kg."""
    clusters = [ClusterSpec(name="n-a", region="north", pue=1.0), ClusterSpec(name="w-a", region="west", pue=1.5)]
    rec, cf = RunRecorder(clusters, policy="gnn"), RunRecorder(clusters, policy="karmada")
    usage = WorkloadUsage(cluster_index=[0, 1, 1], tenant=["small", "big", "mid"], workload=["w1", "w2", "w3"],
                          cpu_core_seconds=[360.0, 3600.0, 1800.0], requested_cpu_cores=[0.1, 1.0, 0.5])
    for hour, ci in enumerate(((100.0, 300.0), (200.0, 400.0))):
        start = T0 + hour * 3600
        rec.record_interval(start, start + 3600, power_watts=[1000.0, 2000.0], idle_power_watts=[200.0, 500.0],
                            carbon_intensity_g_per_kwh=ci, price_per_mwh=(50.0, 80.0),
                            allocatable_cpu_cores=[4.0, 2.0], usage=usage)
        cf.record_interval(start, start + 3600, power_watts=[1500.0, 1500.0], carbon_intensity_g_per_kwh=ci,
                           price_per_mwh=(50.0, 80.0))
    return save_run(tmp_path / "run", {"gnn": rec, "karmada": cf}, primary="gnn", work=work)


@pytest.mark.parametrize(("karmada", "same", "label", "says"), [
    pytest.param(WorkDone(replica_hours=1004.0, placed=50, failures=0), True, "karmada (counterfactual, same work)",
                 "more than karmada for the same work (1,000 replica-hours, 50 workloads placed, 0 failed).",
                 id="same-work"),
    pytest.param(WorkDone(replica_hours=1100.0, placed=50, failures=0), False, "karmada (counterfactual)",
                 # 2,400 g / 1,000 h = 2.4 g vs 2,025 g / 1,100 h = 1.84 g: 30.4 % more
                 "but not for the same work: 1,000 vs 1,100 replica-hours; per replica-hour 2.4 vs 1.8 g CO₂ "
                 "(30.4% more).", id="more-work"),
    pytest.param(WorkDone(replica_hours=1000.0, placed=50, failures=2), False, "karmada (counterfactual)",
                 "but not for the same work: 0 vs 2 failed workloads;", id="different-failures"),
    pytest.param(None, None, "karmada (counterfactual)", "over the same time range; the work each did there was "
                 "not recorded, so it may not have been the same work.", id="not-recorded"),
])
def test_the_counterfactual_claims_the_same_work_only_when_it_was(
        tmp_path: Path, karmada: WorkDone | None, same: bool | None, label: str, says: str) -> None:
    work = {"gnn": GNN, "karmada": karmada} if karmada is not None else None
    report = build_report(load_run(_run(tmp_path, work)))
    assert report.counterfactual is not None and report.counterfactual.same_work is same
    assert counterfactual_label(report) == label
    sentence = counterfactual_sentence(report)
    assert sentence is not None and sentence.startswith("gnn emitted 0.38 kg CO₂ (18.5%) more than karmada")
    assert says in sentence
    assert sentence in render_markdown(report) and f"*{label}*" in render_markdown(report)
    assert report.model_dump(mode="json")["counterfactual"]["same_work"] is same
    # The gRPC answer carries the work, so a live --target report makes the same claim.
    assert report_from_proto(report_to_proto(report)).model_dump() == report.model_dump()


def test_part_of_a_run_does_not_claim_the_whole_runs_work(tmp_path: Path) -> None:
    run = load_run(_run(tmp_path, {"gnn": GNN, "karmada": GNN}))
    whole = build_report(run)
    first_hour = build_report(run, ReportQuery(until=datetime.fromtimestamp(T0 + 3600, tz=UTC)))
    assert whole.counterfactual is not None and whole.counterfactual.same_work is True
    assert first_hour.counterfactual is not None and first_hour.counterfactual.same_work is None
    assert "was not recorded" in str(counterfactual_sentence(first_hour))


def test_tenants_are_listed_by_energy_and_the_unattributed_row_is_explained(tmp_path: Path) -> None:
    run = load_run(_run(tmp_path, None))
    by_tenant = build_report(run, ReportQuery(group_by="tenant"))
    # big 2.5 kWh, small 1.61 (the only CPU user on north), mid 1.25, (unattributed) 0.64; by name it would
    # start with (unattributed)
    assert list(by_tenant.groups) == ["big", "small", "mid", "(unattributed)"]
    assert UNATTRIBUTED_NOTE in by_tenant.notes and UNATTRIBUTED_NOTE in render_markdown(by_tenant)
    by_workload = build_report(run, ReportQuery(group_by="workload"))
    assert "(idle)" in by_workload.groups and UNATTRIBUTED_NOTE in by_workload.notes
    by_region = build_report(run)
    assert list(by_region.groups) == ["north", "west"] and UNATTRIBUTED_NOTE not in by_region.notes
    # Over gRPC the map loses its order; the client puts the tenants back in energy order.
    assert list(report_from_proto(report_to_proto(by_tenant)).groups) == list(by_tenant.groups)


@pytest.mark.parametrize(("work", "caption"), [
    pytest.param({"gnn": GNN, "karmada": GNN}, "for the same work", id="same"),
    pytest.param({"gnn": GNN, "karmada": WorkDone(replica_hours=900.0, placed=49, failures=1)},
                 "not the same work:\n1,000 vs 900 replica-hours\n50 vs 49 workloads placed\n0 vs 1 failed workloads",
                 id="different"),
    pytest.param(None, "(work done not recorded)", id="unknown"),
])
def test_the_plot_caption_follows_the_same_rule(tmp_path: Path, work: dict[str, WorkDone] | None,
                                                caption: str) -> None:
    text = counterfactual_caption(build_report(load_run(_run(tmp_path, work))))
    assert text.startswith("0 kg (18.5%) more\nthan karmada") and text.endswith(caption)


@pytest.mark.parametrize(("a", "b", "same"), [
    pytest.param(GNN, GNN, True, id="identical"),
    pytest.param(GNN, GNN.model_copy(update={"replica_hours": 1005.0}), True, id="0.498%-apart"),
    pytest.param(GNN, GNN.model_copy(update={"replica_hours": 1005.1}), False, id="0.507%-apart"),
    pytest.param(GNN, GNN.model_copy(update={"placed": 49}), False, id="one-fewer-placed"),
    pytest.param(GNN, GNN.model_copy(update={"failures": 1}), False, id="one-failure"),
    pytest.param(GNN, GNN.model_copy(update={"slo_violations": 9}), True, id="slo-is-not-work"),
])
def test_same_work_rule(a: WorkDone, b: WorkDone, same: bool) -> None:
    assert same_work(a, b) is same and same_work(b, a) is same


def test_work_is_saved_with_the_run_and_must_name_recorded_policies(tmp_path: Path) -> None:
    run = load_run(_run(tmp_path, {"gnn": GNN}))
    assert run.work("gnn") == GNN and run.work("karmada") is None
    with pytest.raises(ValueError, match="recorded nothing"):
        _run(tmp_path / "other", {"dqn": GNN})


def test_claim_without_a_baseline_carbon() -> None:
    text = carbon_claim(policy="gnn", carbon_kg=0.0, work=GNN, baseline="karmada", baseline_carbon_kg=0.0,
                        baseline_work=GNN)
    assert text.startswith("gnn emitted 0.00 kg CO₂ (0.0%) less than karmada for the same work")
