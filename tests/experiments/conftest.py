"""Fixtures of the experiments' tests (``experiments/``: research, outside the product)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from openb_helpers import openb_slice

from meridian.model import Node, Pod


@pytest.fixture(scope="session")
def make_openb_slice() -> Callable[..., tuple[list[Node], list[Pod], list[Pod]]]:
    return openb_slice


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
