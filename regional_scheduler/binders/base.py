"""The bind extension point: how a decided placement becomes real.

A binder is the last stage of a placement and the only one that talks to the outside world, so it
runs in kube-scheduler's *binding cycle*, apart from the decision: the service assumes the pod on its
node at once (the next decision sees it), hands the binding to a binder, and rolls the assumption
back if the binder fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class BindRequest:
    """One pod to bind: its identity, the node, and annotations to record with the binding (the GPU
    devices of a shared-GPU pod)."""

    namespace: str
    name: str
    uid: str
    node: str
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class BindError(RuntimeError):
    """The binding was not made; the assumption must be rolled back and the pod retried."""


class BindConflictError(BindError):
    """The pod is bound already (HTTP 409), by this scheduler's earlier attempt or by another one.
    Not retried: the pod informer reports where it really is."""


class PodGoneError(BindError):
    """The pod no longer exists (HTTP 404): nothing to retry."""


class Binder(Protocol):
    name: str

    def bind(self, request: BindRequest) -> None:
        """Make the binding; raise :class:`BindError` (or a subclass) when it was not made."""
        ...
