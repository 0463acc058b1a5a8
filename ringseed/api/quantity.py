"""Byte counts written as Kubernetes quantities: ``67108864``, ``64Mi``, ``1Gi``, ``500M``, ``1e9``.

Owns the parsing of size fields in ringseed's custom resources (``chunkSize``, ``cache.*Bytes``,
``originRateLimit``). Pure, no I/O.

Rules: the syntax is Kubernetes' resource quantity (binary suffixes ``Ki Mi Gi Ti Pi Ei``,
decimal ``k M G T P E``, exponent ``e``/``E``; ``m`` is milli and so never a whole byte count
unless it cancels). The result must be a whole, non-negative number of bytes. This is the CRD
syntax, not the CLI's (``ringseed.protocol.units`` also takes ``64MiB``); api/ may not import
protocol/.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES = {
    "": Decimal(1),
    "Ki": Decimal(1 << 10),
    "Mi": Decimal(1 << 20),
    "Gi": Decimal(1 << 30),
    "Ti": Decimal(1 << 40),
    "Pi": Decimal(1 << 50),
    "Ei": Decimal(1 << 60),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]|[eE][+-]?[0-9]+)?$")


def parse_bytes(value: object) -> int:
    """A whole, non-negative byte count from an int or a quantity string; ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not an integer or a quantity string like 64Mi")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return value
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a quantity like 64Mi, 1Gi or 500M")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            result = Decimal(number).scaleb(int(suffix[1:]))
        else:
            result = Decimal(number) * _SUFFIXES[suffix]
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{value!r} is not a number") from exc
    if result != result.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(result)
