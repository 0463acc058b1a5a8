"""Byte sizes as people write them, in one grammar for every place that takes one.

Owns parsing and formatting of byte sizes: command-line flags, custom-resource fields, the
operator's environment and the chart's values. Pure, no I/O.

Rules (the grammar, stated once):
- ``<number>[<suffix>]``: a decimal number (``64``, ``1.5``, ``.5``, ``+4``) or an exponent form
  (``1e9``); binary suffixes ``Ki Mi Gi Ti Pi Ei`` (powers of 1024) and decimal suffixes
  ``k M G T P E`` (powers of 1000), as in Kubernetes resource quantities.
- ``m`` is refused for every byte size: Kubernetes reads it as milli, most tools as mega, so
  ``500m`` means two different things to two readers. The error says to write ``M`` or ``Mi``.
- Two named syntaxes (:class:`Syntax`), one per use:
  ``QUANTITY`` (custom-resource fields, operator environment, chart values) is exactly the
  Kubernetes quantity grammar above, which the CRD schemas state as a pattern;
  ``FLAG`` (command-line flags) also takes a trailing ``B`` (``64MiB``, ``500MB``), an
  upper-case ``K`` and surrounding blanks.
- The result is a whole, non-negative number of bytes up to 2^63 - 1; a plain ``int`` is taken
  as is.
  Errors are :class:`ValueError` naming the text and the problem.
"""

from __future__ import annotations

import enum
import re
from decimal import Decimal


class Syntax(enum.Enum):
    """Where a size was written; each place has its grammar (see the module docstring)."""

    QUANTITY = "quantity"  # Kubernetes resource quantity: CR fields, operator env, chart values
    FLAG = "flag"  # command-line flags: the quantity grammar plus a trailing B, K and blanks


FACTORS: dict[str, int] = {
    "": 1,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_NUMBER = r"\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_EXPONENT = r"(?P<exponent>[eE][+-]?[0-9]+)"
_SUFFIX = r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[kMGTPE]|mi?)"
# The Kubernetes quantity grammar (with the refused ``m``/``mi`` caught to name it in the error).
_QUANTITY = re.compile(rf"^{_NUMBER}(?:{_EXPONENT}|{_SUFFIX})?$")
_FLAG = re.compile(rf"^\s*{_NUMBER}\s*(?:{_EXPONENT}|(?P<flag_suffix>Ki|Mi|Gi|Ti|Pi|Ei|[kKMGTPE]|mi?)?B?)\s*$")
MAX_BYTES = (1 << 63) - 1  # what a Kubernetes integer field holds
EXAMPLES = {Syntax.QUANTITY: "64Mi, 1Gi, 500M or 1e9", Syntax.FLAG: "64Mi, 64MiB, 1Gi, 500M or 500MB"}


def parse_size(text: object, *, syntax: Syntax = Syntax.FLAG) -> int:
    """A whole, non-negative byte count from ``text`` written in ``syntax``; ``ValueError`` otherwise."""
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise ValueError(f"size {text!r}: not a number of bytes (write e.g. {EXAMPLES[syntax]})")
    if isinstance(text, int):
        if not 0 <= text <= MAX_BYTES:
            raise ValueError(f"size {text!r}: must be between 0 and {MAX_BYTES}")
        return text
    match = (_QUANTITY if syntax is Syntax.QUANTITY else _FLAG).match(text)
    if match is None:
        raise ValueError(f"size {text!r}: expected a number with an optional suffix like {EXAMPLES[syntax]}")
    groups = match.groupdict()
    suffix = groups.get("suffix") or groups.get("flag_suffix") or ""
    if suffix in ("m", "mi"):
        number = groups["number"]
        raise ValueError(
            f"size {text!r}: 'm' is ambiguous for a byte size (milli in Kubernetes, mega elsewhere); "
            f"write {number}M for {number} x 10^6 bytes or {number}Mi for {number} x 2^20 bytes"
        )
    value = Decimal(groups["number"])
    if groups.get("exponent"):
        # Clamped: 1e999999999 must not build a billion-digit number (or overflow Decimal).
        value = value.scaleb(max(-64, min(64, int(groups["exponent"][1:]))))
    else:
        value *= FACTORS["k" if suffix == "K" else suffix]
    if value > MAX_BYTES:
        raise ValueError(f"size {text!r}: larger than {MAX_BYTES} bytes")
    if value != value.to_integral_value():
        raise ValueError(f"size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(n: int | float) -> str:
    """Human form with binary units: ``64.0 MiB``, ``512 B``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
