"""How few GPUs could hold a set of GPU shares? A lower bound, to tell packing loss from workload loss.

A pod that asks for a share of one GPU (``gpu_milli``) lives on one device; devices that hold shares
cannot take a whole-GPU pod. So the shares a policy placed occupy at least ``B`` devices, where ``B``
is the optimum of a one-dimensional bin-packing problem, and those devices leave at least
``B - Σ shares`` GPUs idle. That idle capacity no placement of the same shares can avoid: on the
openb ``default`` list most of it is the 0.19 GPU left beside each 0.81-GPU share, for which the
list has few partners.

``B`` is bounded below by the Gilmore–Gomory configuration LP (each column a set of shares that fits
one device), solved by column generation: the restricted LP with HiGHS, new columns from a bounded
knapsack over the LP's duals, solved by dynamic programming over milli-GPU. The LP bound is within
one or two devices of the integer optimum for instances like these (the "modified integer round-up"
property holds for almost all bin-packing instances), and never above it. At every iteration,
Farley's bound (restricted LP value / best knapsack value) is also valid, so an iteration cap only
makes the bound weaker, never wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from meridian.model import MILLI_GPU_PER_DEVICE

MAX_ITERATIONS = 500
_TOL = 1e-9


@dataclass(frozen=True)
class ShareBound:
    devices: float  # lower bound on the devices the shares need (the LP value, rounded up)
    share_gpus: float  # Σ shares, in GPUs
    iterations: int

    @property
    def idle_gpus(self) -> float:
        """Lower bound on the idle capacity of the devices holding the shares, in GPUs."""
        return max(0.0, self.devices - self.share_gpus)


def _best_column(sizes: np.ndarray, counts: np.ndarray, values: np.ndarray, capacity: int) -> tuple[float, np.ndarray]:
    """Bounded knapsack: the multiset of shares (at most ``counts`` of each size) that fits one device
    and has the largest total dual value. Each type is split into binary chunks (1, 2, 4, …) so the
    0/1 dynamic programme over capacity stays exact."""
    chunk_type: list[int] = []
    chunk_mult: list[int] = []
    for t, n in enumerate(np.minimum(counts, capacity // sizes)):
        k = 1
        while n > 0:
            m = min(k, int(n))
            chunk_type.append(t)
            chunk_mult.append(m)
            n -= m
            k *= 2
    best = np.zeros(capacity + 1)
    taken = np.zeros((len(chunk_type), capacity + 1), dtype=bool)
    for c, (t, m) in enumerate(zip(chunk_type, chunk_mult, strict=True)):
        w, v = int(sizes[t]) * m, float(values[t]) * m
        if w > capacity or v <= 0:
            continue
        cand = best[: capacity + 1 - w] + v
        better = cand > best[w:] + _TOL
        taken[c, w:] = better
        best[w:] = np.where(better, cand, best[w:])
    column = np.zeros(len(sizes), dtype=np.int64)
    cap = int(np.argmax(best))
    value = float(best[cap])
    for c in range(len(chunk_type) - 1, -1, -1):
        if taken[c, cap]:
            column[chunk_type[c]] += chunk_mult[c]
            cap -= int(sizes[chunk_type[c]]) * chunk_mult[c]
    return value, column


def share_packing_bound(shares: Mapping[int, int], *, capacity: int = MILLI_GPU_PER_DEVICE,
                        max_iterations: int = MAX_ITERATIONS) -> ShareBound:
    """Lower bound on the devices needed to hold ``shares`` ({milli-GPU share: pod count})."""
    items = sorted((int(s), int(n)) for s, n in shares.items() if n > 0)
    for s, _ in items:
        if not 0 < s <= capacity:
            raise ValueError(f"a GPU share must be in 1..{capacity} milli-GPU, got {s}")
    if not items:
        return ShareBound(0.0, 0.0, 0)
    sizes = np.array([s for s, _ in items], dtype=np.int64)
    counts = np.array([n for _, n in items], dtype=np.int64)
    share_gpus = float((sizes * counts).sum()) / capacity
    # Start with one column per size: as many of it as fit one device.
    columns = [np.where(np.arange(len(sizes)) == t, min(int(counts[t]), capacity // int(sizes[t])), 0)
               for t in range(len(sizes))]
    bound = share_gpus  # Σ shares is itself a valid (weak) bound
    for it in range(1, max_iterations + 1):
        a = np.array(columns, dtype=float).T
        res = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-counts.astype(float), bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"share packing LP failed: {res.message}")
        duals = -np.asarray(res.ineqlin.marginals, dtype=float)
        value, column = _best_column(sizes, counts, duals, capacity)
        # Farley: no column has dual value above `value`, so LP* ≥ restricted LP / value.
        bound = max(bound, float(res.fun) / max(value, 1.0))
        if value <= 1.0 + 1e-7:
            return ShareBound(_whole(max(bound, float(res.fun))), share_gpus, it)
        columns.append(column)
    return ShareBound(_whole(bound), share_gpus, max_iterations)


def _whole(devices: float) -> float:
    # A device count is an integer, so the bound rounds up (the tolerance absorbs the LP's rounding).
    return float(np.ceil(devices - 1e-6))
