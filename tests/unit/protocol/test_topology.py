"""Ring order: exact bottleneck optimum for small groups, a good heuristic for large ones."""

from __future__ import annotations

import itertools
import random

import pytest

from ringseed.protocol import topology


def _brute_force(bw: list[list[float]]) -> float:
    n = len(bw)
    return max(topology.bottleneck((0, *rest), bw) for rest in itertools.permutations(range(1, n)))


def _random_matrix(n: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[0.0 if i == j else float(rng.randint(1, 40)) for j in range(n)] for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("seed", range(4))
def test_exact_order_matches_brute_force(n: int, seed: int) -> None:
    bw = _random_matrix(n, seed)
    order = topology.solve(bw)
    assert sorted(order) == list(range(n))
    assert order[0] == 0
    assert topology.bottleneck(order, bw) == _brute_force(bw)


def test_asymmetric_links_are_respected() -> None:
    # 0->1->2->3->0 is fast one way only; the reverse direction is slow.
    bw = [[0.0] * 4 for _ in range(4)]
    for i in range(4):
        for j in range(4):
            if i != j:
                bw[i][j] = 1.0
    for i in range(4):
        bw[i][(i + 1) % 4] = 100.0
    assert topology.solve(bw) == (0, 1, 2, 3)


def test_slow_link_is_avoided() -> None:
    # Four peers all at 10 GB/s except that peer 2 reaches peer 3 at 0.1 GB/s.
    bw = [[0.0 if i == j else 10e9 for j in range(4)] for i in range(4)]
    bw[2][3] = 0.1e9
    order = topology.solve(bw)
    assert topology.bottleneck(order, bw) == 10e9


@pytest.mark.parametrize("n", [13, 16])
def test_heuristic_finds_a_planted_fast_ring(n: int) -> None:
    rng = random.Random(n)
    bw = [[0.0 if i == j else float(rng.randint(1, 9)) for j in range(n)] for i in range(n)]
    planted = list(range(n))
    rng.shuffle(planted)
    for a, b in itertools.pairwise([*planted, planted[0]]):
        bw[a][b] = 10.0
    order = topology.solve(bw)
    assert sorted(order) == list(range(n))
    assert topology.bottleneck(order, bw) == 10.0


def test_heuristic_close_to_exact_on_random_matrices() -> None:
    for seed in range(3):
        bw = _random_matrix(9, seed)
        exact = topology.bottleneck(topology.solve(bw), bw)
        heuristic = topology.bottleneck(topology.solve(bw, exact_limit=0), bw)
        assert heuristic >= 0.75 * exact


def test_same_matrix_same_ring() -> None:
    bw = _random_matrix(8, 5)
    assert topology.solve(bw) == topology.solve([list(r) for r in bw])


def test_non_square_matrix_is_rejected() -> None:
    with pytest.raises(ValueError):
        topology.solve([[0.0, 1.0], [1.0]])
