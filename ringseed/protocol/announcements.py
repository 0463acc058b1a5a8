"""Announcements on the wire: a heartbeat's verified chunks as runs, not one item per chunk.

Pure: no I/O. The agent (``ringseed/agent/agent.py``) packs the announcements it takes for a
heartbeat with :func:`pack`; the tracker (:meth:`ringseed.protocol.tracker.Tracker.heartbeat`)
takes the three parts (``chunks``, ``runs``, ``sources``) as they come.

Rules:
- An announcement carrying a hash (the origin puller's, or one the tracker asked for again)
  stays an item ``[index, hash, from]``: the tracker checks each hash claim.
- The others become ``runs`` ``[[first, count]]`` of consecutive indices (a node gets chunks
  mostly in order, so a paced heartbeat of ~200 chunks is a run or two: a few bytes to decode
  and O(1) checks per run at the tracker instead of a Python step per chunk, BENCHMARKS section 9).
- The same runs carry a view's chunk lists to an agent that asks for them (``index_runs``):
  ``avail`` levels, ``pulling``, ``pulling_stopped`` (pulls are claimed lowest index first and
  levels move for the chunks at the front together, so the lists are runs); :func:`expand`
  reads them back.
- Where the chunks came from is evidence for :mod:`ringseed.protocol.trust` (a vouch per
  distinct source): ``sources`` ``[[index, node]]`` names each distinct source once, with the
  first chunk of the batch that came from it, at most ``MAX_SOURCES`` of them (the tracker takes
  at most a few vouches per heartbeat anyway; later heartbeats name others).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_SOURCES = 16  # distinct sources named per heartbeat

Item = tuple[int, str | None, str | None]  # (index, hash or None, the node it came from or None)


def pack(
    batch: Iterable[Item], *, max_sources: int = MAX_SOURCES
) -> tuple[list[list[Any]], list[list[int]], list[list[Any]]]:
    """``(chunks, runs, sources)`` for a batch of announcements."""
    items: list[list[Any]] = []
    plain: list[int] = []
    sources: list[list[Any]] = []
    named: set[str] = set()
    for index, digest, source in batch:
        if digest is not None:
            items.append([index, digest, source])
            continue
        plain.append(index)
        if source is not None and source not in named and len(sources) < max_sources:
            named.add(source)
            sources.append([index, source])
    return items, runs_of(plain), sources


def runs_of(indices: Iterable[int]) -> list[list[int]]:
    """``[[first, count]]`` covering ``indices`` (sorted, repeats once)."""
    runs: list[list[int]] = []
    for index in sorted(set(indices)):
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, 1])
    return runs


MAX_EXPANDED = 1 << 21  # chunks a list of runs may name (the tracker's MAX_CHUNKS)


def expand(runs: object, *, label: str = "runs") -> list[int]:
    """The indices of ``[[first, count]]`` runs, in order (ValueError naming the bad run)."""
    if not isinstance(runs, list):
        raise ValueError(f"{label} must be a list of [first, count]")
    out: list[int] = []
    for n, run in enumerate(runs):
        if not isinstance(run, list) or len(run) != 2 or type(run[0]) is not int or type(run[1]) is not int:
            raise ValueError(f"{label}[{n}] must be [first, count]")
        first, count = run
        if first < 0 or count < 1 or len(out) + count > MAX_EXPANDED:
            raise ValueError(f"{label}[{n}] names chunks out of range")
        out.extend(range(first, first + count))
    return out
