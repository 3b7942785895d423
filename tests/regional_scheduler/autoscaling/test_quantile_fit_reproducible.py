"""The linear quantile fit gives the same weights wherever its inputs sit in memory.

The held-back figures of the ``quantile`` policy were once seen moving between processes: LAPACK's
least-squares driver returned different starts for the same ill-conditioned design at other addresses,
and the optimisation amplified it. This design (a near-constant column, collinear columns) reproduces it:
the earlier fit gave a different answer for each memory layout below.
"""

from __future__ import annotations

import numpy as np
import torch

from regional_scheduler.autoscaling.quantile_forecaster import fit_pinball


def _design(n: int = 6000, k: int = 22) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    base = rng.normal(size=(n, 4))
    x = np.concatenate([np.ones((n, 1)), base @ rng.normal(size=(4, k - 1)) + 1e-7 * rng.normal(size=(n, k - 1))],
                       axis=1)
    x[:, 3] = 2.0 + 1e-9 * rng.normal(size=n)
    y = x[:, 1] * 0.5 + rng.exponential(size=n)
    return x, y


def test_fit_does_not_depend_on_memory_layout() -> None:
    x, y = _design()
    rng = np.random.default_rng(7)
    fits, keep = [], []
    for _ in range(4):
        # Other allocations between fits move where the fit's own buffers land.
        keep.append(torch.empty(int(rng.integers(1, 100_000)), dtype=torch.float64))
        keep.append(np.empty(int(rng.integers(1, 100_000))))
        offset = int(rng.integers(0, 8))  # and the input itself at another alignment
        buf = np.empty(x.size + 8)
        moved = buf[offset:offset + x.size].reshape(x.shape)
        moved[:] = x
        fits.append(fit_pinball(moved, y, (0.5, 0.9), steps=60, seed=0))
    for other in fits[1:]:
        np.testing.assert_array_equal(fits[0], other)
    assert np.all(np.isfinite(fits[0]))
