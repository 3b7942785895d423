"""kubectl-like operator commands against a live API (issue 24): ``watch --until`` and its deadline,
``get``/``cancel``/``watch`` by ID prefix or name, and ``-o table|wide|json|yaml|name`` on each command."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import defaultdict

import pytest
import yaml
from typer.testing import CliRunner

from global_scheduler.cli_output import (
    CLUSTER_COLUMNS,
    OUTPUT_FORMATS,
    WORKLOAD_COLUMNS,
    human_age,
    render_clusters,
    render_table,
    render_workloads,
)
from global_scheduler.client import GlobalClient, state_reached
from meridian.cli import build_app
from meridian.envtest import wait_for
from protos import global_api_pb2 as api

TOKEN = "test-token"
WATCH_LINE = re.compile(r"^\d\d:\d\d:\d\d  (\w+) ", re.MULTILINE)


def _spec(name: str, tenant: str = "shop", cpu: str = "500m") -> api.WorkloadSpec:
    return api.WorkloadSpec(name=name, tenant=tenant, replicas=1,
                            requests=api.ResourceQuantities(cpu=cpu, memory="1Gi"))


@pytest.fixture
def live(federation):
    """(federation, client, env for the CLI, run(args) -> result)."""
    fed = federation()
    env = {"MERIDIAN_API": fed.target, "MERIDIAN_TOKEN": TOKEN}
    app, runner = build_app(), CliRunner()
    client = GlobalClient(fed.target, token=TOKEN)
    yield fed, client, lambda args: runner.invoke(app, args, env=env)
    client.close()


def _running(client: GlobalClient, name: str, tenant: str = "shop") -> api.Workload:
    w = client.submit(_spec(name, tenant))
    return wait_for(lambda: (x := client.get(w.id)).state == api.WORKLOAD_STATE_RUNNING and x,
                    message=f"{name} to run")


# --- watch -----------------------------------------------------------------------------------------

def test_watch_until_running_and_only_changes_print(live) -> None:
    fed, client, run = live
    w = client.submit(_spec("web"))
    out = run(["watch", w.id[:10], "--until", "running", "--timeout", "30"])
    assert out.exit_code == 0, out.output
    states = WATCH_LINE.findall(out.stdout)
    assert states[-1] == "RUNNING" and states.count("RUNNING") == 1, out.stdout
    lines = out.stdout.splitlines()
    assert all(a[10:] != b[10:] for a, b in itertools.pairwise(lines)), out.stdout  # less the time
    # Until its end: a snapshot that changes nothing shown (only updated_unix_s) prints nothing.
    result: dict[str, object] = {}
    sent = [0]  # snapshots the server's watch has sent
    real_watch = fed.engine.store.watch

    def counting_watch(*args, **kwargs):
        for snapshot in real_watch(*args, **kwargs):
            sent[0] += 1
            yield snapshot

    fed.engine.store.watch = counting_watch
    try:
        watcher = threading.Thread(target=lambda: result.update(out=run(["watch", "web", "--timeout", "30"])))
        watcher.start()
        wait_for(lambda: fed.server.streams.open == 1 and sent[0] == 1, message="the watch to open")
        for i in range(3):
            fed.engine.store.update(w.id)  # a new version, the same state, cluster and message
            wait_for(lambda i=i: sent[0] == 2 + i, interval=0.02, message=f"the watch to send version {i + 2}")
    finally:
        del fed.engine.store.watch  # the class's again
    client.cancel(w.id)
    watcher.join(timeout=30)
    out = result["out"]
    assert out.exit_code == 0, out.output  # any end is what a watch without --until waits for
    assert WATCH_LINE.findall(out.stdout) == ["RUNNING", "CANCELLED"], out.stdout


def test_watch_deadline_and_unwanted_end_exit_non_zero(live) -> None:
    _, client, run = live
    w = _running(client, "batch")
    out = run(["watch", w.id, "--timeout", "1"])
    assert out.exit_code == 1, out.output
    assert WATCH_LINE.findall(out.stdout) == ["RUNNING"]
    assert out.stderr.strip() == (f"error: timed out after 1 s waiting for workload {w.id} to end; it is RUNNING")
    client.cancel(w.id)
    out = run(["watch", w.id, "--until", "running", "--timeout", "10"])
    assert out.exit_code == 1 and out.stderr.count("\n") == 1, out.output
    assert "is CANCELLED (cancelled by the operator): it will not be RUNNING" in out.stderr
    out = run(["watch", w.id, "--until", "done"])
    assert out.exit_code == 2 and "unknown state 'done'" in out.output and out.output.count("\n") == 1


@pytest.mark.parametrize(("state", "goal", "reached"), [
    pytest.param(api.WORKLOAD_STATE_RUNNING, api.WORKLOAD_STATE_RUNNING, True, id="the-state"),
    pytest.param(api.WORKLOAD_STATE_RUNNING, api.WORKLOAD_STATE_SCHEDULED, True, id="a-later-step"),
    pytest.param(api.WORKLOAD_STATE_DISPATCHED, api.WORKLOAD_STATE_RUNNING, False, id="an-earlier-step"),
    pytest.param(api.WORKLOAD_STATE_CANCELLED, api.WORKLOAD_STATE_RUNNING, False, id="ended-otherwise"),
    pytest.param(api.WORKLOAD_STATE_RUNNING, api.WORKLOAD_STATE_FAILED, False, id="not-yet-failed"),
    pytest.param(api.WORKLOAD_STATE_FAILED, None, True, id="any-end"),
    pytest.param(api.WORKLOAD_STATE_RUNNING, None, False, id="not-ended"),
])
def test_state_reached(state: int, goal: int | None, reached: bool) -> None:
    assert state_reached(state, goal) is reached


# --- references: ID prefix or name -----------------------------------------------------------------

def test_get_cancel_by_prefix_or_name(live) -> None:
    _, client, run = live
    ids = [client.submit(_spec(f"job-{i}", cpu="10m")).id for i in range(17)]  # 17 IDs: two share a first digit
    by_digit: dict[str, list[str]] = defaultdict(list)
    for wid in ids:
        by_digit[wid[0]].append(wid)
    shared = next(d for d, group in by_digit.items() if len(group) > 1)
    out = run(["get", shared])
    assert out.exit_code == 2, out.output
    assert f"'{shared}' matches {len(by_digit[shared])} workloads; give more of the ID" in out.stderr
    assert all(wid in out.stderr for wid in by_digit[shared])
    out = run(["get", ids[3][:8], "-o", "json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["id"] == ids[3], out.output
    out = run(["get", "job-5", "-o", "name"])
    assert out.stdout.strip() == f"workload/{ids[5]}"
    # One name in two tenants: ambiguous until --tenant; a name reused after a cancellation: the active one.
    web_shop, web_ads = client.submit(_spec("web")), client.submit(_spec("web", tenant="ads"))
    out = run(["get", "web"])
    assert out.exit_code == 2 and "give the ID, or --tenant" in out.stderr, out.output
    assert web_shop.id in out.stderr and web_ads.id in out.stderr
    out = run(["cancel", "web", "--tenant", "ads", "-o", "json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["id"] == web_ads.id, out.output
    web_ads_2 = client.submit(_spec("web", tenant="ads"))
    out = run(["get", "web", "--tenant", "ads", "-o", "name"])
    assert out.stdout.strip() == f"workload/{web_ads_2.id}", out.output
    assert [w.id for w in client.find_active_by_name("web", "ads")] == [web_ads_2.id]
    assert client.find_active_by_name("web", "ads", exclude_id=web_ads_2.id) == []
    # Nothing matching is still the server's NOT_FOUND.
    out = run(["get", "nothing-called-this"])
    assert out.exit_code == 2 and "WORKLOAD_NOT_FOUND" in out.output


# --- output formats --------------------------------------------------------------------------------

def _without(value: object, keys: set[str]) -> object:
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    return value


def test_every_output_format(live) -> None:
    _, client, run = live
    w = _running(client, "web")
    for args, kind, key in ((["ls"], "workload", "id"), (["get", w.id[:6]], "workload", "id"),
                            (["clusters"], "cluster", "name")):
        as_json = json.loads(run([*args, "-o", "json"]).stdout)
        as_yaml = yaml.safe_load(run([*args, "-o", "yaml"]).stdout)
        # Two calls apart: clusters' last-seen and summary times move between them, nothing else may.
        moving = {"lastSeenUnixS", "last_seen_unix_s", "secondsSinceLastSummary", "updatedUnixS"}
        assert _without(as_json, moving) == _without(as_yaml, moving)
        items = as_json if isinstance(as_json, list) else [as_json]
        assert isinstance(as_json, list) == (args[0] != "get")
        names = run([*args, "-o", "name"]).stdout.splitlines()
        assert names == [f"{kind}/{x[key]}" for x in items]
        table, wide = run([*args]).stdout, run([*args, "-o", "wide"]).stdout
        assert max(len(line) for line in table.splitlines()) <= 100, table
        assert "…" not in table and "…" not in wide
        if kind == "workload":
            assert table.split()[:5] == ["ID", "NAME", "TENANT", "STATE", "CLUSTER"], table
            assert "READY" in wide.splitlines()[0], wide
            assert w.id[:8] in table and w.id not in table and w.id in wide
            assert "REGION" in wide and "NODES" in wide and "REGION" not in table
            assert "NOT BEFORE" not in wide  # empty for every row: left out
        else:
            assert table.split()[:4] == ["CLUSTER", "REGION", "STATUS", "NODES"], table
            assert "FREE GPU" not in table  # no cluster has GPUs
            assert "QUEUED" in wide and "QUEUED" not in table
    assert "TENANT" not in run(["ls", "--tenant", "shop"]).stdout  # the filter says it
    # watch -o: one JSON object a line, YAML documents.
    client.cancel(w.id)
    lines = run(["watch", w.id, "-o", "json"]).stdout.splitlines()
    assert json.loads(lines[-1])["state"] == "WORKLOAD_STATE_CANCELLED"
    docs = list(yaml.safe_load_all(run(["watch", w.id, "-o", "yaml"]).stdout))
    assert docs[-1]["id"] == w.id
    assert run(["watch", w.id, "-o", "name"]).stdout.strip() == f"workload/{w.id}"


@pytest.mark.parametrize("args", [
    pytest.param(["ls"], id="ls"), pytest.param(["get", "x"], id="get"), pytest.param(["watch", "x"], id="watch"),
    pytest.param(["cancel", "x"], id="cancel"), pytest.param(["clusters"], id="clusters"),
])
def test_unknown_output_is_a_one_line_error(args: list[str]) -> None:
    # Checked before any call: no server is needed (nothing listens at this address).
    out = CliRunner().invoke(build_app(), [*args, "-o", "xml"], env={"MERIDIAN_API": "127.0.0.1:1"})
    assert out.exit_code == 2
    assert out.output == f"error: unknown output format 'xml': use one of {', '.join(OUTPUT_FORMATS)}\n"


# --- tables: 100 columns ---------------------------------------------------------------------------

NOW = 1_780_000_000.0


def _workload(wid: str, name: str, tenant: str, state: int, cluster: str, message: str,
              age_s: float = 300.0) -> api.Workload:
    return api.Workload(id=wid, spec=api.WorkloadSpec(name=name, tenant=tenant, replicas=4), state=state,
                        cluster=cluster, region="eu-central" if cluster else "", attempt=1 if cluster else 0,
                        message=message, created_unix_s=NOW - age_s, nodes=[f"{cluster}-n0"] if cluster else [])


# Typical rows: the scheduler's own messages (global_scheduler/scheduler.py), names as in docs/.
TYPICAL = [
    _workload("3f2a9c1be07d4c55a1e2b3c4d5e6f708", "train-recsys", "ads", api.WORKLOAD_STATE_RUNNING, "central-1",
              "scheduled on central-1"),
    _workload("9b1c0d2e3f4a5b6c7d8e9f0a1b2c3d4e", "web", "shop", api.WORKLOAD_STATE_DISPATCHED, "north-1",
              "dispatched to north-1 (attempt 1)", age_s=12),
    _workload("0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f", "etl-nightly", "analytics", api.WORKLOAD_STATE_PENDING, "",
              "waiting: no cluster has reported yet", age_s=4 * 3600),
    _workload("7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b", "api-gateway", "shop", api.WORKLOAD_STATE_CANCELLED, "west-2",
              "cancelled by the operator", age_s=90_000),
]


def _rich_lines(text: str, width: int) -> list[str]:
    """The text as a terminal of ``width`` columns shows it (rich's Console, as the CLI's other tables)."""
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(text, markup=False, highlight=False)
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [pytest.param(100, id="100-columns"), pytest.param(None, id="pipe")])
def test_typical_tables_fit_100_columns_uncut(width: int | None) -> None:
    for text in (render_workloads(TYPICAL, "table", width=width, now_unix_s=NOW),
                 render_clusters([api.Cluster(name="central-1", region="eu-central", ready=True, nodes=40,
                                              allocatable_milli_cpu=1_280_000, free_milli_cpu=310_500,
                                              allocatable_memory_bytes=5120 * 2**30, free_memory_bytes=1900 * 2**30,
                                              gpus=32, free_gpus=5, carbon_g_per_kwh=312.4, queued_workloads=3)],
                                 "table", width=width, now_unix_s=NOW)):
        lines = _rich_lines(text, 100)
        assert lines == text.splitlines(), text  # nothing wrapped
        assert max(map(len, lines)) <= 100 and "…" not in text, text
    table = render_workloads(TYPICAL, "table", width=width, now_unix_s=NOW).splitlines()
    assert table[0].split() == ["ID", "NAME", "TENANT", "STATE", "CLUSTER", "AGE", "MESSAGE"]
    assert table[1].split()[:6] == ["3f2a9c1b", "train-recsys", "ads", "RUNNING", "central-1", "5m"]
    assert table[3].split()[4:6] == ["-", "4h"]  # pending: no cluster yet


def test_long_message_is_cut_to_the_terminal_not_in_a_pipe() -> None:
    # A pending workload's reason as the scheduler writes it: 77 characters, more than 100 columns leave.
    deferred = _workload("4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d", "big-2", "ads", api.WORKLOAD_STATE_PENDING, "",
                         "waiting: 0/2 clusters available: 2 insufficient free capacity for all replicas")
    cut = render_workloads([*TYPICAL, deferred], "table", width=100, now_unix_s=NOW)
    assert max(map(len, cut.splitlines())) == 100 and cut.splitlines()[-1].endswith("…")
    assert cut.splitlines()[1].endswith("scheduled on central-1")  # only the line that is too long is cut
    whole = render_workloads([*TYPICAL, deferred], "table", width=None, now_unix_s=NOW)
    assert deferred.message.strip() in whole
    wide = render_workloads([*TYPICAL, deferred], "wide", width=100, now_unix_s=NOW)  # wide is never cut
    assert "…" not in wide and deferred.id in wide


@pytest.mark.parametrize(("rows", "absent"), [
    pytest.param([TYPICAL[2]], {"CLUSTER"}, id="all-pending-no-cluster"),
    pytest.param(TYPICAL, set(), id="some-placed"),
])
def test_columns_empty_in_every_row_are_left_out(rows: list[api.Workload], absent: set[str]) -> None:
    header = render_table(WORKLOAD_COLUMNS, rows, now_unix_s=NOW).splitlines()[0]
    assert not absent & set(header.split())
    assert {"ID", "NAME", "STATE", "MESSAGE"} <= set(header.split())
    clusters = render_table(CLUSTER_COLUMNS, [api.Cluster(name="a", region="r", ready=False, nodes=1,
                                                          carbon_unknown=True)],
                            wide=True, now_unix_s=NOW).splitlines()
    assert clusters[0].split() == ["CLUSTER", "REGION", "STATUS", "NODES", "FREE", "CPU", "FREE", "MEMORY",
                                   "CARBON(g/kWh)", "QUEUED"]  # no GPUs, price or last report: left out
    assert clusters[1].split()[2:] == ["NotReady", "1", "0/0", "0/0Gi", "unknown", "0"]


@pytest.mark.parametrize(("seconds", "age"), [
    pytest.param(45, "45s", id="seconds"), pytest.param(200, "3m20s", id="minutes-seconds"),
    pytest.param(42 * 60, "42m", id="minutes"), pytest.param(5 * 3600 + 720, "5h12m", id="hours-minutes"),
    pytest.param(30 * 3600, "30h", id="hours"), pytest.param(3 * 86400 + 4 * 3600, "3d4h", id="days-hours"),
    pytest.param(20 * 86400, "20d", id="days"), pytest.param(800 * 86400, "2y", id="years"),
])
def test_human_age_like_kubectl(seconds: float, age: str) -> None:
    assert human_age(seconds) == age


def test_submit_warns_when_the_name_is_already_running_and_refuses_an_unknown_output_first(live, tmp_path) -> None:
    _, client, run = live
    first = _running(client, "api", tenant="shop")
    path = tmp_path / "api.yaml"
    path.write_text("name: api\ntenant: shop\nreplicas: 1\nrequests: {cpu: 500m, memory: 1Gi}\n")
    before = len(list(client.list(tenant="shop")))
    refused = run(["submit", str(path), "-o", "xml"])
    assert refused.exit_code == 2 and len(list(client.list(tenant="shop"))) == before  # nothing was submitted
    out = run(["submit", str(path), "-o", "name"])
    assert out.exit_code == 0, out.output
    assert f"warning: tenant shop already has 'api' not ended: {first.id}" in out.output
    # the same key again is the same workload: no warning about itself
    again = run(["submit", str(path), "-o", "name", "--idempotency-key", "k1"])
    again2 = run(["submit", str(path), "-o", "name", "--idempotency-key", "k1"])
    assert again.stdout == again2.stdout
    assert again2.output.count("warning:") == 1  # the earlier two, not the resubmitted one itself
