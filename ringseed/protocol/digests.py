"""Chunk hashes on the wire in runs: the binary digests of consecutive chunks, base64 in one string.

A reply that tells a node the hashes it learned (``ringseed/master/tracker.py``) carries
``hash_runs: [[first, base64], ...]``: ``base64`` is the concatenated 32-byte SHA-256 digests of
chunks ``first, first + 1, ...``. Hashes are learned mostly in chunk order (origin pulls take
the lowest unheld chunks first), so runs are long and a hash costs about 43 bytes instead of the
~72 of ``"index":"64 hex digits",``; the floor is the 32 bytes of the digest itself.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

DIGEST_BYTES = 32
MAX_INDEX = (1 << 31) - 1


class DigestError(ValueError):
    """Runs that do not decode (the message names the problem)."""


def pack(hashes: Mapping[int, str]) -> list[list[int | str]]:
    """``{index: hex digest}`` as runs of consecutive indices (an empty digest is left out)."""
    runs: list[list[int | str]] = []
    first = last = -2
    run: list[str] = []
    for index in sorted(hashes):
        digest = hashes[index]
        if not digest:
            continue
        if index != last + 1 and run:
            runs.append([first, _b64(run)])
            run = []
        if not run:
            first = index
        run.append(digest)
        last = index
    if run:
        runs.append([first, _b64(run)])
    return runs


def _b64(hex_digests: list[str]) -> str:
    return base64.b64encode(bytes.fromhex("".join(hex_digests))).decode("ascii")


def unpack(runs: Any) -> dict[int, str]:
    """The ``{index: hex digest}`` of ``runs`` (:class:`DigestError` naming what is wrong)."""
    if not isinstance(runs, list):
        raise DigestError("hash_runs must be a list of [first index, base64 digests]")
    out: dict[int, str] = {}
    for n, run in enumerate(runs):
        if not isinstance(run, list) or len(run) != 2 or type(run[0]) is not int or not isinstance(run[1], str):
            raise DigestError(f"hash_runs[{n}] must be [first index, base64 digests]")
        first, text = run
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise DigestError(f"hash_runs[{n}] is not base64: {exc}") from None
        if not raw or len(raw) % DIGEST_BYTES:
            raise DigestError(f"hash_runs[{n}] holds {len(raw)} bytes, not a whole number of 32-byte digests")
        count = len(raw) // DIGEST_BYTES
        if first < 0 or first + count - 1 > MAX_INDEX:
            raise DigestError(f"hash_runs[{n}] names chunks out of range")
        for k in range(count):
            out[first + k] = raw[k * DIGEST_BYTES : (k + 1) * DIGEST_BYTES].hex()
    return out


class Learned(Mapping[int, str]):
    """The hashes of ``indices`` (ascending), read on demand from a store that keeps them both as
    hex (``hexes``) and as binary digests (``raw``, 32 bytes per chunk): a reply packs its runs
    straight from the binary (:meth:`runs`) without a hex string per hash; as a mapping it
    reads the hex. The store must not change the digests of these chunks (a tracker's hashes
    are set once per layout)."""

    def __init__(self, indices: list[int], hexes: Sequence[str | None], raw: bytes | bytearray) -> None:
        self._indices, self._hexes, self._raw = indices, hexes, raw
        self._members: set[int] | None = None

    def __getitem__(self, index: int) -> str:
        if self._members is None:
            self._members = set(self._indices)
        if index not in self._members:
            raise KeyError(index)
        return self._hexes[index] or ""

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)

    def runs(self) -> list[list[int | str]]:
        """:func:`pack` of these hashes, from the binary digests."""
        runs: list[list[int | str]] = []
        raw, b64 = self._raw, base64.b64encode
        first = last = -2
        for index in self._indices:
            if index != last + 1:
                if last >= 0:
                    runs.append([first, b64(raw[first * DIGEST_BYTES : (last + 1) * DIGEST_BYTES]).decode("ascii")])
                first = index
            last = index
        if last >= 0:
            runs.append([first, b64(raw[first * DIGEST_BYTES : (last + 1) * DIGEST_BYTES]).decode("ascii")])
        return runs


def packed(hashes: Mapping[int, str]) -> list[list[int | str]]:
    """:func:`pack`, from the binary digests when ``hashes`` is :class:`Learned`."""
    return hashes.runs() if isinstance(hashes, Learned) else pack(hashes)
