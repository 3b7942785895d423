from pathlib import Path

import pytest

from meridian.traces import TraceFormatError, openb

OPENB = openb.openb_dir()  # $MERIDIAN_TRACES, else ../shared/traces beside the project
POD_LISTS = sorted(OPENB.glob("openb_pod_list_*.csv"))
# Row counts from the traces README.
EXPECTED_ROWS = {"default": 8152, "cpu0": 7064, "cpu300": 10094, "gpushare100": 8152, "multigpu50": 9061}


def test_all_pod_lists_are_present() -> None:
    assert len(POD_LISTS) == 22


@pytest.mark.parametrize("path", POD_LISTS, ids=lambda p: p.stem.removeprefix("openb_pod_list_"))
def test_every_shared_pod_list_loads(path: Path) -> None:
    pods = openb.load_pods(path)
    name = path.stem.removeprefix("openb_pod_list_")
    if name in EXPECTED_ROWS:
        assert len(pods) == EXPECTED_ROWS[name]
    assert all(p.requests.milli_cpu >= 0 for p in pods)
    assert len({p.name for p in pods}) == len(pods)


def test_default_composition_matches_readme() -> None:
    pods = openb.load_pods(OPENB / "openb_pod_list_default.csv")
    gpus = [p.requests.gpu if p.requests.gpu else (1 if p.requests.gpu_milli else 0) for p in pods]
    assert {k: gpus.count(k) for k in (0, 1, 2, 4, 8)} == {0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}
    assert round(openb.total_gpu_milli(pods) / 1000) == 6087


def test_node_lists_match_readme() -> None:
    nodes = openb.load_nodes(OPENB / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213 and sum(n.capacity.gpu for n in nodes) == 6212
    assert len(openb.load_nodes(OPENB / "openb_node_list_all_node.csv")) == 1523


def test_node_shapes_are_the_node_list_as_arrays(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,1024,0,\nn1,96000,2048,8,V100M32\nn2,64000,512,0,T4\n")
    shapes = openb.load_node_shapes(path)
    assert len(shapes) == 3
    assert shapes.alloc.tolist() == [[32000, 1024 * 2**20, 0], [96000, 2048 * 2**20, 8], [64000, 512 * 2**20, 0]]
    assert shapes.gpu_model == ("", "V100M32", "")  # a node without GPUs has no board, whatever the column says
    nodes = openb.load_nodes(OPENB / "openb_node_list_all_node.csv")
    full = openb.load_node_shapes(OPENB / "openb_node_list_all_node.csv")
    assert full.alloc.tolist() == [[n.capacity.milli_cpu, n.capacity.memory_bytes, n.capacity.gpu] for n in nodes]


@pytest.mark.parametrize(
    ("body", "line", "column"),
    [
        pytest.param("p0,1000,512,1,abc\n", 2, "gpu_milli", id="not-a-number"),
        pytest.param("p0,1000,512,1,500\np1,-5,512,0,0\n", 3, "cpu_milli", id="negative"),
        pytest.param("p0,1000,512,0,300\n", 2, "gpu_milli", id="share-without-gpu"),
        pytest.param("p0,1000,512\n", 2, "<row>", id="short-row"),
        pytest.param("p0,1000,512,3,500\n", 2, "gpu_milli", id="multi-gpu-share"),
    ],
)
def test_unreadable_rows_name_file_line_and_column(tmp_path: Path, body: str, line: int, column: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + body)
    with pytest.raises(TraceFormatError) as err:
        openb.load_pods(path)
    assert (err.value.line, err.value.column) == (line, column)
    assert str(path) in str(err.value)


def test_unknown_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="unknown layout"):
        openb.load_pods(path)


def test_inflation_reaches_ratio_and_is_deterministic() -> None:
    pods = openb.load_pods(OPENB / "openb_pod_list_default.csv")
    cap = 6212 * 1000
    a = openb.inflate_pods(pods, cap, ratio=1.3, seed=42)
    b = openb.inflate_pods(pods, cap, ratio=1.3, seed=42)
    assert [p.name for p in a] == [p.name for p in b]
    assert openb.total_gpu_milli(a) >= 1.3 * cap
    assert 10_700 < len(a) < 11_000  # the paper's simulator had 10,866 for seed 42
