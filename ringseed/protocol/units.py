"""Byte sizes as people write them: ``64Mi``, ``1Gi``, ``1048576``, ``500M``.

Owns parsing and formatting of sizes for flags and CR fields. Pure, no I/O.

Rules: binary suffixes ``Ki Mi Gi Ti Pi`` (powers of 1024, Kubernetes style), decimal suffixes
``k K M G T P`` (powers of 1000), an optional trailing ``B`` is accepted (``64MiB``, ``500MB``);
the result must be a whole, non-negative number of bytes. Errors are :class:`ValueError`
naming the text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_FACTORS = {
    "": 1,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
    "pi": 1 << 50,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "p": 10**15,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtTpP]i?)?B?\s*$")


def parse_size(text: str | int) -> int:
    """Parse a byte size; ``ValueError`` naming the text when it is not one."""
    if isinstance(text, bool):
        raise ValueError(f"size {text!r}: not a number of bytes")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size {text!r}: must not be negative")
        return text
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"size {text!r}: expected a number with an optional suffix like 64Mi, 1Gi or 500M")
    number, suffix = match.group(1), (match.group(2) or "").lower()
    try:
        value = Decimal(number) * _FACTORS[suffix]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"size {text!r}: not a number") from exc
    if value != value.to_integral_value():
        raise ValueError(f"size {text!r}: is not a whole number of bytes")
    return int(value)


def format_size(n: int | float) -> str:
    """Human form with binary units: ``64.0 MiB``, ``512 B``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
