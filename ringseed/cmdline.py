"""What every ``ringseed`` command line shares: argument types and the token.

Owns the checks of command-line values, so that a bad value is refused by argparse with one line
naming the option and the problem (exit 2), never a traceback from deep inside a command:
sizes (``64Mi``), chunk sizes (1 MiB to 1 GiB), rates, positive counts and seconds. Also the
group token, read from ``--token-file`` or ``RINGSEED_TOKEN`` (the file wins).

Rules: every type function raises :class:`argparse.ArgumentTypeError` with a message that
names the value; argparse adds the option name. Pure apart from :func:`read_token`.
"""

from __future__ import annotations

import argparse
import math
import os

from ringseed.protocol import manifest, units

TOKEN_ENV = "RINGSEED_TOKEN"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that ends with ``(default: X)`` wherever there is a default worth saying.

    Not for flags, nor for options whose default is "not set" (None) or whose help already
    says what the default is.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def size(text: str) -> int:
    """A byte size such as ``64Mi``, ``1G`` or ``1048576``."""
    try:
        return units.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def positive_size(text: str) -> int:
    """A byte size above zero (a rate in bytes/s, a memory budget)."""
    value = size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 bytes")
    return value


def chunk_size(text: str) -> int:
    """A chunk size between 1 MiB and 1 GiB."""
    try:
        return manifest.check_chunk_size(units.parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def positive_int(text: str) -> int:
    """A whole number of at least 1 (nodes, peers, slots)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    """A whole number of at least 0 (a port where 0 means any, slots that may be off)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535)")
    return value


def fraction(text: str) -> float:
    """A number from 0 up to, not including, 1 (a spread around a nominal value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 0 and below 1")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above zero."""
    return _seconds(text, zero=False)


def non_negative_seconds(text: str) -> float:
    """A finite number of seconds, 0 or more (0: off)."""
    return _seconds(text, zero=True)


def _seconds(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        bound = ", 0 or more" if zero else " above 0"
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds{bound}")
    return value


def read_token(token_file: str | None) -> str | None:
    """The group token from ``token_file`` (stripped) or ``RINGSEED_TOKEN``; the file wins.

    ``ValueError`` naming the file when it cannot be read.
    """
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--token-file {token_file}: {getattr(exc, 'strerror', None) or exc}") from exc
    return os.environ.get(TOKEN_ENV) or None
