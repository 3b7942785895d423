"""Kubernetes resource quantities with Kubernetes' own semantics.

Parsing is delegated to the official client's :func:`kubernetes.utils.parse_quantity` (the same
suffix table as ``k8s.io/apimachinery/pkg/api/resource``); this module adds what a scheduler needs
around it: one error type that names the field and the value, rejection of negative, non-finite and
absurd values, and conversion to the integer units Meridian stores (millicores, bytes, milli-GPU).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from kubernetes.utils import parse_quantity

# Anything above an exa-unit is a typo or an attack, not a resource request (2**63 bytes = 8 EiB).
MAX_QUANTITY = Decimal(2**63)

_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL_SUFFIXES = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


class QuantityError(ValueError):
    """A resource quantity that Kubernetes would reject, or that Meridian cannot store."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid quantity for {field!r}: {value!r} ({reason})")


def parse(value: str | int | float | Decimal, *, field: str = "quantity") -> Decimal:
    """Parse a Kubernetes quantity (``100m``, ``1.5``, ``2Gi``, ``1e3``, ``500Mi``, ``1k``) exactly.

    Raises :class:`QuantityError` for malformed, negative, non-finite or absurdly large values.
    """
    if isinstance(value, bool):
        raise QuantityError(field, value, "a boolean is not a quantity")
    if isinstance(value, float) and value != value:
        raise QuantityError(field, value, "NaN is not a quantity")
    text = str(value).strip() if not isinstance(value, str) else value.strip()
    if not text:
        raise QuantityError(field, value, "empty")
    if any(ch.isspace() for ch in text):
        raise QuantityError(field, value, "whitespace inside a quantity")
    if text.lower() in {"nan", "inf", "+inf", "-inf", "infinity"}:
        raise QuantityError(field, value, "not a finite number")
    try:
        parsed = parse_quantity(text)
    except (ValueError, InvalidOperation, TypeError) as exc:
        raise QuantityError(field, value, f"not a Kubernetes quantity: {exc}") from None
    if not parsed.is_finite():
        raise QuantityError(field, value, "not a finite number")
    if parsed < 0:
        raise QuantityError(field, value, "must not be negative")
    if parsed > MAX_QUANTITY:
        raise QuantityError(field, value, f"larger than the maximum {MAX_QUANTITY}")
    return parsed


def to_milli(value: str | int | float | Decimal, *, field: str = "cpu") -> int:
    """CPU (or GPU share) in milli-units, rounded up as Kubernetes does for ``MilliValue``."""
    q = parse(value, field=field) * 1000
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def to_int(value: str | int | float | Decimal, *, field: str = "memory") -> int:
    """Bytes (or counts), rounded up as Kubernetes does for ``Value``."""
    q = parse(value, field=field)
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def format_bytes(n_bytes: int) -> str:
    """Canonical form of a byte count: the largest binary suffix that divides it exactly."""
    if n_bytes < 0:
        raise QuantityError("memory", n_bytes, "must not be negative")
    for suffix, factor in _BINARY_SUFFIXES:
        if n_bytes and n_bytes % factor == 0:
            return f"{n_bytes // factor}{suffix}"
    return str(n_bytes)


def format_milli(milli: int) -> str:
    """Canonical form of a milli-unit count: whole units when exact, else ``<n>m``."""
    if milli < 0:
        raise QuantityError("cpu", milli, "must not be negative")
    if milli % 1000 == 0:
        whole = milli // 1000
        for suffix, factor in _DECIMAL_SUFFIXES:
            if whole and whole % factor == 0:
                return f"{whole // factor}{suffix}"
        return str(whole)
    return f"{milli}m"
