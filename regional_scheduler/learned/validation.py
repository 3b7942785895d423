"""The validation split used to choose between placement checkpoints — training lists only.

Ten full-cluster (1,213-node) openb runs, GPU allocation at 100 % arrived: runs 0–7 on training
lists augmented with GPU-model constraints (:func:`~regional_scheduler.learned.augment.augmented_pod_list`,
seed ``5_000_000 + j``, every run augmented), runs 8–9 on plain training lists; openb inflation
seed ``5000 + j`` (the benchmark uses 42–51). No held-out list (``default``, ``gpuspec*``,
``multigpu*``) is used. Run::

    MERIDIAN_LEARNED_CHECKPOINT=path.pt python -m regional_scheduler.learned.validation fgd,learned out.json

The CPU profile's split (``cpu`` as a third argument): seed-50x200 on seeds 3000–3029 (training uses
1000+ for a few hundred episodes at most, the benchmark 0–9); failure rate, Gini and CPU allocation.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from meridian.traces import openb
from regional_scheduler.bench_placement import BenchInput, run_one
from regional_scheduler.learned.augment import augmented_pod_list

LISTS = ("cpu050", "gpushare40", "cpu200", "gpushare80", "cpu0", "cpu300", "gpushare20", "cpu100",
         "cpu037", "gpushare100")
N_AUGMENTED = 8


def _policy(spec: str) -> str:
    """``name`` or ``learned=PATH`` (a candidate checkpoint; several may be compared in one run)."""
    name, _, path = spec.partition("=")
    if path:
        os.environ["MERIDIAN_LEARNED_CHECKPOINT"] = path
    return name


def validation_runs(policies: list[str], n: int = len(LISTS)) -> list[dict[str, Any]]:
    nodes = openb.load_nodes()
    rows = []
    for j in range(n):
        name = LISTS[j % len(LISTS)]
        pods = openb.load_pods(openb.openb_dir() / f"openb_pod_list_{name}.csv")
        pods, share = augmented_pod_list(pods, nodes, 5_000_000 + j, p_augment=1.0 if j < N_AUGMENTED else 0.0)
        inp = BenchInput("openb", nodes, pods)
        for policy in policies:
            result = run_one(inp, _policy(policy), 5000 + j)
            rows.append({"j": j, "list": name, "share": share, "policy": policy,
                         "gpu100": result.curve[100]["gpu_alloc_pct"]})
            print(rows[-1], flush=True)
    return rows


CPU_SEEDS = range(3000, 3030)


def cpu_validation_runs(policies: list[str]) -> list[dict[str, Any]]:
    from meridian.simulator import seed_cluster

    inp = BenchInput("seed-50x200", seed_cluster(), [])
    rows = []
    for seed in CPU_SEEDS:
        for policy in policies:
            r = run_one(inp, _policy(policy), seed)
            rows.append({"seed": seed, "policy": policy, "failure_rate": r.failure_rate,
                         "frag_gini": r.final["frag_gini"], "cpu_alloc_pct": r.final["cpu_alloc_pct"]})
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        print(policy, {k: sum(r[k] for r in mine) / len(mine) for k in ("failure_rate", "frag_gini", "cpu_alloc_pct")},
              flush=True)
    return rows


def main(argv: list[str]) -> None:
    if len(argv) > 2 and argv[2] == "cpu":
        Path(argv[1]).write_text(json.dumps(cpu_validation_runs(argv[0].split(",")), indent=1))
        return
    rows = validation_runs(argv[0].split(","))
    Path(argv[1]).write_text(json.dumps(rows, indent=1))
    for policy in argv[0].split(","):
        values = [r["gpu100"] for r in rows if r["policy"] == policy]
        print(policy, "mean", sum(values) / len(values))


if __name__ == "__main__":
    main(sys.argv[1:])
