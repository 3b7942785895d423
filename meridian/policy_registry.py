"""Name → lazily imported constructor: the one scheme of the placement, routing and autoscaling registries.

Each tier's ``registry.py`` holds ``REGISTRY = PolicyRegistry(kind, {name: "package.module:build"},
learned=...)`` and exposes ``names`` and ``get_policy(name, **kwargs)`` (the registry's own methods) and
``BASELINES`` (every entry but the learned one). An entry is a string, so reading the names (``meridian --help``, option validation) imports no
policy module (numpy, torch); the module is imported on the first construction. No registration by
import side effect: the table is the whole list. Keys are the modules' name constants (``NAME`` for
``build``, ``BURST_NAME`` for ``build_burst``: :func:`name_constant`), which a test of each tier checks.

The core imports no component: the entries are strings, imported by :mod:`importlib`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

PolicyT = TypeVar("PolicyT")


class UnknownPolicyError(KeyError):
    """A name no registry entry has; the message names the kind and lists the known names."""

    def __init__(self, name: str, kind: str, known: Iterable[str]) -> None:
        self.name, self.kind, self.known = name, kind, tuple(known)
        super().__init__(f"unknown {kind} policy {name!r}; known: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError's own str() is the repr of the message, quotes and all
        return str(self.args[0])


def split_target(target: str) -> tuple[str, str]:
    """``"package.module:build"`` → ``("package.module", "build")``."""
    module, sep, attribute = target.partition(":")
    if not sep or not module or not attribute.isidentifier():
        raise ValueError(f"policy constructor {target!r} is not 'package.module:function'")
    return module, attribute


def name_constant(attribute: str) -> str:
    """The module constant holding the name a constructor builds: ``build`` → ``NAME``, ``build_burst`` →
    ``BURST_NAME``."""
    if attribute == "build":
        return "NAME"
    variant = attribute.removeprefix("build_")
    if variant == attribute or not variant:
        raise ValueError(f"policy constructor {attribute!r} is neither build nor build_<variant>")
    return f"{variant.upper()}_NAME"


class PolicyRegistry(Generic[PolicyT]):
    """The policies of one kind (``"placement"``, ``"routing"``, ``"autoscaling"``), in listing order.

    ``name in registry``, ``iter(registry)`` and :meth:`names` read the table only; :meth:`get`
    imports the entry's module (once, as any import) and calls its constructor. ``learned`` names the
    tier's learned policy, the one entry :attr:`baselines` leaves out.
    """

    def __init__(self, kind: str, entries: Mapping[str, str], *, learned: str | None = None,
                 error: type[UnknownPolicyError] = UnknownPolicyError) -> None:
        for target in entries.values():
            split_target(target)
        if learned is not None and learned not in entries:
            raise ValueError(f"the learned {kind} policy {learned!r} is not an entry")
        self.kind = kind
        self.entries: Mapping[str, str] = MappingProxyType(dict(entries))
        self.learned = learned
        self._error = error

    @property
    def baselines(self) -> tuple[str, ...]:
        """Every entry but the learned one, in listing order."""
        return tuple(name for name in self.entries if name != self.learned)

    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"PolicyRegistry({self.kind!r}, {dict(self.entries)!r})"

    def error(self, name: str) -> UnknownPolicyError:
        """The error for an unknown ``name`` (for a caller that validates names without constructing)."""
        return self._error(name, self.kind, self.entries)

    def target(self, name: str) -> str:
        """The entry of ``name``: ``"package.module:build"``."""
        try:
            return self.entries[name]
        except KeyError:
            raise self.error(name) from None

    def constructor(self, name: str) -> Callable[..., Any]:
        """Imports the module of ``name`` and returns its constructor (not called)."""
        module, attribute = split_target(self.target(name))
        return getattr(importlib.import_module(module), attribute)

    def get(self, name: str, **kwargs: Any) -> PolicyT:
        """A new policy ``name``, built with ``kwargs``; :class:`UnknownPolicyError` for an unknown name."""
        policy: PolicyT = self.constructor(name)(**kwargs)
        return policy
