"""Ring order from a measured bandwidth matrix: the bottleneck asymmetric TSP.

Owns the choice of ring order. A ring all-reduce moves the same bytes over every link at the
same time, so its speed is set by its slowest link: the best ring is the directed Hamiltonian
cycle whose *minimum* link bandwidth is largest (bottleneck ATSP, maximin form). Pure: no I/O.

Rules:
- ``bandwidth[i][j]`` is what peer ``i`` measured sending to peer ``j`` (bytes/s); the
  diagonal is ignored; a missing measurement is 0 (the link is treated as unusable).
- The returned order always starts with index 0 (a ring has no start; this makes it stable).
- Up to :data:`EXACT_LIMIT` peers the answer is exact (dynamic programming over subsets, the
  maximin form of Held-Karp). Beyond, a heuristic: a greedy widest-next tour from every start,
  improved by node moves and swaps, compared by the sorted list of link values (so a move that
  removes one of several equal bottleneck links still counts as progress).
- Deterministic: the same matrix always gives the same ring, so every caller agrees.
"""

from __future__ import annotations

from collections.abc import Sequence

EXACT_LIMIT = 12
_MAX_PASSES = 50

Matrix = Sequence[Sequence[float]]


def _check(bandwidth: Matrix) -> int:
    n = len(bandwidth)
    if any(len(row) != n for row in bandwidth):
        raise ValueError("bandwidth matrix must be square")
    return n


def links(order: Sequence[int], bandwidth: Matrix) -> list[float]:
    """Bandwidth of every directed link of the ring ``order`` (empty for fewer than 2 peers)."""
    n = len(order)
    if n < 2:
        return []
    return [float(bandwidth[order[i]][order[(i + 1) % n]]) for i in range(n)]


def bottleneck(order: Sequence[int], bandwidth: Matrix) -> float:
    """The slowest link of the ring (``inf`` for fewer than 2 peers)."""
    values = links(order, bandwidth)
    return min(values) if values else float("inf")


def solve(bandwidth: Matrix, *, exact_limit: int = EXACT_LIMIT) -> tuple[int, ...]:
    """The ring order (indices into the matrix) whose slowest link is fastest."""
    n = _check(bandwidth)
    if n <= 3:
        return _small(bandwidth, n)
    if n <= exact_limit:
        return _exact(bandwidth, n)
    return _heuristic(bandwidth, n)


def _small(bandwidth: Matrix, n: int) -> tuple[int, ...]:
    if n < 3:
        return tuple(range(n))
    a, b = (0, 1, 2), (0, 2, 1)
    return a if bottleneck(a, bandwidth) >= bottleneck(b, bandwidth) else b


def _exact(bandwidth: Matrix, n: int) -> tuple[int, ...]:
    """Maximin Held-Karp from node 0: best[mask][v] = widest path 0 -> v visiting ``mask``."""
    neg = float("-inf")
    full = (1 << n) - 1
    best = [[neg] * n for _ in range(1 << n)]
    parent = [[-1] * n for _ in range(1 << n)]
    best[1][0] = float("inf")
    for mask in range(1, full + 1, 2):  # masks containing node 0
        row = best[mask]
        for v in range(n):
            width = row[v]
            if width == neg:
                continue
            out = bandwidth[v]
            for u in range(1, n):
                if mask >> u & 1:
                    continue
                cand = min(width, float(out[u]))
                nxt = mask | 1 << u
                if cand > best[nxt][u]:
                    best[nxt][u] = cand
                    parent[nxt][u] = v
    end = max(range(1, n), key=lambda v: (min(best[full][v], float(bandwidth[v][0])), -v))
    order = [end]
    mask = full
    while order[-1] != 0:
        v = order[-1]
        order.append(parent[mask][v])
        mask &= ~(1 << v)
    return tuple(reversed(order))


def _score(order: Sequence[int], bandwidth: Matrix) -> list[float]:
    return sorted(links(order, bandwidth))


def _greedy(bandwidth: Matrix, n: int, start: int) -> list[int]:
    order = [start]
    left = set(range(n)) - {start}
    while left:
        here = order[-1]
        nxt = max(sorted(left), key=lambda u: float(bandwidth[here][u]))
        order.append(nxt)
        left.remove(nxt)
    return order


def _neighbourhood(order: list[int]) -> list[list[int]]:
    """Orders one node move or one swap away."""
    n = len(order)
    out: list[list[int]] = []
    for i in range(n):
        rest = order[:i] + order[i + 1 :]
        out.extend([*rest[:j], order[i], *rest[j:]] for j in range(n) if j != i)
    for i in range(n):
        for j in range(i + 1, n):
            swapped = list(order)
            swapped[i], swapped[j] = swapped[j], swapped[i]
            out.append(swapped)
    return out


def _improve(order: list[int], bandwidth: Matrix) -> list[int]:
    score = _score(order, bandwidth)
    for _ in range(_MAX_PASSES):
        better = max(_neighbourhood(order), key=lambda o: _score(o, bandwidth))
        better_score = _score(better, bandwidth)
        if better_score <= score:
            break
        order, score = better, better_score
    return order


def _rotate(order: Sequence[int]) -> tuple[int, ...]:
    i = list(order).index(0)
    return tuple(order[i:]) + tuple(order[:i])


def _heuristic(bandwidth: Matrix, n: int) -> tuple[int, ...]:
    starts = sorted({_rotate(_greedy(bandwidth, n, s)) for s in range(n)}, key=lambda o: _score(o, bandwidth))
    candidates = [_rotate(_improve(list(o), bandwidth)) for o in starts[-3:]]
    return max(sorted(candidates, reverse=True), key=lambda o: _score(o, bandwidth))
